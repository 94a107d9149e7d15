"""Each command's --help: examples that run as written (their pass and pattern names exist), the allowed values
of an option with few (`--weight-bits {4,8,16}`), and no stray `%%` (click prints help text as written)."""
from __future__ import annotations

import re
import shlex

import click
import pytest
from click.testing import CliRunner

from qcompiler.cli import main
from qcompiler.passmanager import available_passes
from qcompiler.patterns import all_patterns
from qcompiler.quant.core.bitwidths import INT_BITS

COMMANDS = [[]] + [[name] for name in sorted(main.commands)]


def _help(cmd) -> str:
    r = CliRunner().invoke(main, [*cmd, "--help"], catch_exceptions=False, terminal_width=120)
    assert r.exit_code == 0, r.output
    return r.output


def _examples(text: str) -> list:
    return [ln.strip() for ln in text.split("Examples:", 1)[1].splitlines() if ln.strip().startswith("qcompiler")]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "qcompiler")
def test_help_has_examples_and_no_stray_percent(cmd):
    text = _help(cmd)
    assert "%%" not in text
    lines = _examples(text)
    assert lines, text
    passes, patterns = available_passes(), all_patterns()
    for ln in lines:
        argv = shlex.split(ln)
        assert argv[1] in main.list_commands(click.Context(main)), ln
        for flag in ("--pipeline", "--recipe"):
            if flag in argv:
                for name in argv[argv.index(flag) + 1].split(","):
                    assert name in passes, f"example names unknown pass {name!r}: {ln}"
        if argv[1] == "match" and argv[3] != "list":
            assert argv[3] in patterns, f"example names unknown pattern {argv[3]!r}: {ln}"


def test_quantize_help_shows_allowed_bit_widths():
    text = _help(["quantize"])
    allowed = "{" + ",".join(map(str, INT_BITS)) + "}"
    for flag in ("--weight-bits", "--act-bits", "--head-bits"):
        assert re.search(rf"{flag} {re.escape(allowed)}", text), flag
    from qcompiler.quant.core.switches import OPTIMIZE
    assert "[" + "|".join(OPTIMIZE) + "]" in text
