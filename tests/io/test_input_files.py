"""qcompiler/input_files.py: every input file is a regular file read within its kind's bound, and reading a small
file never reserves the bound (read(n) allocates n bytes up front: a 2 GB reservation per model read made every
command need over 2 GB of address space)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from qcompiler.errors import ConfigError
from qcompiler.input_files import read_bounded


def test_small_file_under_a_small_address_space(tmp_path):
    p = tmp_path / "m.bin"
    p.write_bytes(b"x" * 1000)
    code = ("import sys; from qcompiler.input_files import read_bounded; "
            f"assert read_bounded({str(p)!r}, 'model') == b'x' * 1000")
    lim = 400 << 20

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    r = subprocess.run([sys.executable, "-c", code], preexec_fn=limited, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_bounds_and_kinds(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"a" * 100)
    assert read_bounded(p, "config", ConfigError, limit=100) == b"a" * 100
    with pytest.raises(ConfigError, match="over the 99-byte limit"):
        read_bounded(p, "config", ConfigError, limit=99)
    with pytest.raises(ConfigError, match="is a folder"):
        read_bounded(tmp_path, "config", ConfigError)
    with pytest.raises(ConfigError, match="device"):
        read_bounded("/dev/zero", "config", ConfigError)
    os.mkfifo(tmp_path / "f")
    with pytest.raises(ConfigError, match="FIFO"):
        read_bounded(tmp_path / "f", "config", ConfigError)
    with pytest.raises(ConfigError, match="NUL"):
        read_bounded("a\x00b", "config", ConfigError)
    with pytest.raises(ConfigError, match="no such file"):
        read_bounded(tmp_path / "missing", "config", ConfigError)
