"""Built-in config presets: `--config NAME` (API `config="NAME"`) reads qcompiler/quant/settings/presets/NAME.yaml when no
file of that name exists; a file always wins. Each preset is an ordinary config file (qcompiler/quant/settings/config.py),
to read or copy:

- `w8a8`: SmoothQuant's W8A8 (Xiao et al. 2023): int8 weights and int8 inputs for MatMul/Gemm only, every other
  op float, nothing widened to 16 bits. With `--recipe smoothquant` it is the paper's setting.
"""
from __future__ import annotations

import os

PRESETS_DIR = os.path.dirname(os.path.abspath(__file__))


def presets() -> list:
    """The built-in preset names."""
    return sorted(f[:-5] for f in os.listdir(PRESETS_DIR) if f.endswith(".yaml"))


def preset_path(path: str) -> str:
    """`path` itself, or the built-in preset file when `path` is a preset's name and no such file exists."""
    if isinstance(path, str) and path in presets() and not os.path.lexists(path):
        return os.path.join(PRESETS_DIR, path + ".yaml")
    return path
