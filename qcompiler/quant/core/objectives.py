"""What the user asks placement to trade for (`--optimize`): one list, read by the switch table and the profiles.

accuracy: every quantizer stays; balanced (default): quantizers only where an integer kernel uses them;
latency: balanced plus a measured search that trades output SQNR for speed; size: activations as balanced,
weights stored narrow wherever that makes the file smaller (docs/optimize.md).
"""
from __future__ import annotations

OPTIMIZE = ("accuracy", "balanced", "latency", "size")
