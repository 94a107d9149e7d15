"""Placement's knobs: the API arguments, and each node's settings resolved from them, the profile and a config."""
from __future__ import annotations

from qcompiler.quant.settings.selection import config_with_rules as extend
from qcompiler.quant.targets.profiles import Profile


class PlacementOptions:
    """Global knobs (API arguments) used when no config rule says otherwise."""

    def __init__(self, per_channel=True, weight_bits=8, act_bits=8, act_symmetric=None, weight_symmetric=None,
                 config=None, supergroups=True, weight_block=None, optimize="balanced"):
        self.per_channel, self.weight_bits, self.act_bits = per_channel, weight_bits, act_bits
        self.weight_block = weight_block
        self.act_symmetric, self.weight_symmetric = act_symmetric, weight_symmetric
        self.config, self.supergroups = config, supergroups
        # accuracy keeps every quantizer; balanced (default) drops, on a target whose fusions are known, every
        # 8-bit or widened quantizer with no integer-kernel neighbour and sends integer islands too small for
        # their borders with float Convs float, weights kept on their grid; latency applies the table's cost
        # rules everywhere and floats the weights of float kernels too (float_regions.py, cost.py)
        self.optimize = optimize


BY_USER_CONFIG = "config (a rule, --exclude or --op-types)"   # who decided a node's settings, in reasons


def node_settings(opts: PlacementOptions, profile: Profile, node):
    """Resolved per-node settings as a dict (config rules when a config is given, else API args + profile)."""
    a, w = profile.activation, profile.weight
    s = {"act_bits": opts.act_bits, "act_symmetric": a.symmetric if opts.act_symmetric is None
         else opts.act_symmetric, "weight_bits": opts.weight_bits,
         "weight_symmetric": w.symmetric if opts.weight_symmetric is None else opts.weight_symmetric,
         "weight_per_channel": opts.per_channel, "weight_block": opts.weight_block, "weight_quantized": True,
         "bias_quantized": True, "keep_float": False, "precision": "int", "output_quantized": True,
         "input_quantized": False, "encoding_min": None, "encoding_max": None,
         "by": BY_USER_CONFIG, "weights_ruled": False}
    cfg = opts.config
    if cfg is not None and node is not None:
        ns = cfg.settings_for(node)
        for k in ("act_bits", "act_symmetric", "weight_bits", "weight_symmetric", "weight_per_channel",
                  "weight_block", "weight_quantized", "bias_quantized", "precision", "output_quantized",
                  "input_quantized", "encoding_min", "encoding_max"):
            if hasattr(ns, k):
                s[k] = getattr(ns, k)
        s["keep_float"] = bool(getattr(ns, "keep_float", False))
        s["by"] = getattr(ns, "decided_by", "") or BY_USER_CONFIG
        s["weights_ruled"] = bool(getattr(ns, "weights_ruled", False))
    return s


RUN_DEFAULT_KEYS = ("act_bits", "weight_bits", "weight_per_channel", "weight_block", "act_symmetric",
                    "weight_symmetric")


def config_with_rules(opts: PlacementOptions, profile: Profile, rules: list):
    """`opts.config` with `rules` appended, or, without a config, the run's arguments as one: how a pass adds
    per-node settings (smoothquant, mixed-precision) without changing any other node's. A bare QuantConfig would
    replace the arguments with its 8-bit defaults (a config's settings replace --weight-bits and the rest)."""
    s = node_settings(opts, profile, None)
    return extend(opts.config, rules, {k: s[k] for k in RUN_DEFAULT_KEYS})
