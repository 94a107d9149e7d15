"""What the user asks for: config files (AIMET quantsim JSON or our YAML), built-in presets, node selection
(--exclude/--op-types), and the bounded readers for untrusted config-like files."""
