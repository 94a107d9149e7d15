"""The command-line reference (docs/cli.md), written from the commands themselves so it cannot drift.

Every option of every command comes from its click declaration; the options of `qcompiler quantize` that are
switches come from the switch table (qcompiler/quant/core/switches.py), which adds the `quantize()` keyword and
the config key that set the same thing, and lists the keywords that have no flag. `python -m
qcompiler.cli_reference docs/cli.md` rewrites the file; tests/test_docs.py checks that the committed file is
what this module writes.
"""
from __future__ import annotations

import inspect
import re
import sys
import textwrap
from typing import List, Optional

import click

from qcompiler.cli import main
from qcompiler.quant.core.switches import SWITCHES

WIDTH = 112
FIRST = ("quantize", "debug", "run", "inspect", "list-passes", "match")   # the order a reader meets them in


def commands() -> list:
    """Every command of `qcompiler`, the common ones first, any other (a new command) after them by name."""
    names = main.list_commands(click.Context(main))        # the lazily loaded commands too
    return [n for n in FIRST if n in names] + sorted(n for n in names if n not in FIRST)


def _cell(text) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _metavar(p: click.Parameter, ctx: click.Context) -> str:
    if isinstance(p, click.Option) and p.is_flag:
        return ""
    return p.make_metavar(ctx)


def _spelling(p: click.Option, ctx: click.Context) -> str:
    """`--weight-bits {4,8,16}`, `-o, --output TEXT`, `--per-channel / --per-tensor`."""
    names = ", ".join(p.opts)
    if p.secondary_opts:
        names += " / " + ", ".join(p.secondary_opts)
    mv = _metavar(p, ctx)
    return f"{names} {mv}" if mv else names


def _default(p: click.Option) -> str:
    d = p.default
    if not isinstance(d, (str, int, float, bool, tuple, type(None))):
        return ""      # click's "not given" sentinel
    if p.is_flag and p.secondary_opts:
        return "" if d is None else (p.opts[0] if d else p.secondary_opts[0])
    if d is None or d is False or d == () or p.is_flag:
        return ""
    return str(d)


def _synopsis(cmd: click.Command, name: str, ctx: click.Context) -> str:
    """`qcompiler NAME ARG [--opt X] ...`, every option, wrapped."""
    parts = []
    for p in cmd.params:
        if isinstance(p, click.Argument):
            parts.append(p.make_metavar(ctx))
        elif isinstance(p, click.Option) and "--help" not in p.opts:
            flag = p.opts[0]
            if p.secondary_opts:
                flag = f"{flag}/{p.secondary_opts[-1]}"
            mv = _metavar(p, ctx)
            text = f"{flag} {mv}" if mv else flag
            parts.append(text if p.required else f"[{text}]" + ("..." if p.multiple else ""))
    args = [x for x in parts if not x.startswith(("[", "-"))]
    required = [x for x in parts if x.startswith("-")]
    optional = [x for x in parts if x.startswith("[")]
    return textwrap.fill(" ".join([f"qcompiler {name}", *args, *required, *optional]), WIDTH,
                         subsequent_indent="    ", break_on_hyphens=False, break_long_words=False)


def _examples(cmd: click.Command) -> List[str]:
    text = cmd.epilog or ""
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("qcompiler")]


def _command(name: str) -> List[str]:
    cmd = main.get_command(click.Context(main), name)       # loads a lazy command
    ctx = click.Context(cmd, info_name=name)
    switches = {s.name: s for s in SWITCHES}
    is_quantize = name == "quantize"
    doc = inspect.cleandoc((cmd.help or "").split("\f")[0])
    out = [f"## qcompiler {name}", "", doc, "", "```", _synopsis(cmd, name, ctx), "```", ""]
    options = [p for p in cmd.params if isinstance(p, click.Option) and "--help" not in p.opts]
    if is_quantize:
        out += ["| option | default | what it does | `quantize()` keyword | config key |", "|---|---|---|---|---|"]
    elif options:
        out += ["| option | default | what it does |", "|---|---|---|"]
    for p in options:
        row = [f"`{_cell(_spelling(p, ctx))}`", f"`{_cell(_default(p))}`" if _default(p) else "", _cell(p.help or "")]
        if is_quantize:
            s = switches.get(p.name)
            row += [f"`{s.name}`" if s else "", f"`{s.config_key}`" if s and s.config_key else ""]
        out.append("| " + " | ".join(row) + " |")
    if is_quantize:
        api_only = [s for s in SWITCHES if s.flag is None]
        if api_only:
            out += ["", "Keywords of `quantize()` without a flag:", ""]
            out += [f"- `{s.name}=` ({_cell(s.api_only)}): {_cell(s.doc)}" for s in api_only]
    ex = _examples(cmd)
    if ex:
        out += ["", "Examples:", "", "```bash", *ex, "```"]
    return out + [""]


def reference() -> str:
    """docs/cli.md: every command with its synopsis, options (defaults, allowed values) and examples."""
    lines = ["# Command-line reference", "",
             "Written from the commands themselves by `python -m qcompiler.cli_reference docs/cli.md` (the "
             "switches of `qcompiler quantize` come from `qcompiler/quant/core/switches.py`); do not edit by "
             "hand: `tests/test_docs.py` checks the file against the commands. `qcompiler COMMAND --help` shows "
             "the same.", ""]
    lines += [f"- [`qcompiler {n}`](#qcompiler-{n})" for n in commands()]
    lines.append("")
    for name in commands():
        lines += _command(name)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip("\n") + "\n"


def _write(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    text = reference()
    if not argv:
        sys.stdout.write(text)
        return
    with open(argv[0], "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":  # pragma: no cover
    _write()
