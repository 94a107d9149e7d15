"""The instrumentation flags `qcompiler run` and `qcompiler quantize` share, and the instruments they make.

One definition of `--verify-each`, `--print-after`, `--dump-dir`, `--time-passes` and `--stats`, so both
commands spell, check and print them alike (reports on stderr, after the pipeline).
The instrumentations and the sample reader are imported when a command makes them: the options are part of the
command line every start-up builds (`qcompiler --help` imports neither onnx nor numpy).
"""
from __future__ import annotations

import os

import click

from qcompiler.errors import ArgumentError


def examples(*lines: str) -> str:
    """A command's --help epilog: its example command lines, kept as written (click's `\b`: no re-wrapping)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {ln}" for ln in lines)


def instrument_options(f):
    """Add the shared instrumentation flags to a click command (keyword arguments of the same names)."""
    for opt in reversed((
        click.option("--verify-each", is_flag=True, help="after each pass: IR invariants, onnx.checker, and "
                     "onnxruntime outputs (equal for semantics-preserving passes; SQNR against the input model "
                     "for passes that change semantics, such as insert-qdq)"),
        click.option("--print-after", "print_after", multiple=True, metavar="PASS",
                     help="print the IR after this pass ('all' for every pass); repeatable"),
        click.option("--dump-dir", type=click.Path(), help="write the ONNX model after each pass into this folder"),
        click.option("--time-passes", is_flag=True, help="print the wall time of each pass"),
        click.option("--stats", is_flag=True, help="print each pass's statistics"),
    )):
        f = opt(f)
    return f


class Instruments:
    """The instrumentations the flags ask for; `report()` prints their reports on stderr after the run."""

    def __init__(self, passes, inputs, verify_each=False, print_after=(), dump_dir=None, time_passes=False,
                 stats=False, feeds=None, feeds_name=None, feeds_factory=None):
        from qcompiler.passmanager.instrumentation import PrintIR, Statistics, Timing, Verifier
        self.verifier = Verifier(feeds=feeds, feeds_name=feeds_name, feeds_factory=feeds_factory) \
            if verify_each else None
        self.timing = Timing() if time_passes else None
        self.statistics = Statistics() if stats else None
        self.list = [i for i in (self.verifier, self.timing, self.statistics) if i is not None]
        if print_after:
            known = {p.name for p in passes} | {"all"}
            unknown = [n for n in print_after if n not in known]
            if unknown:
                raise ArgumentError(f"--print-after '{unknown[0][:80]}' is not a pass of this pipeline "
                                    f"({', '.join(p.name for p in passes)})")
            self.list.append(PrintIR(print_after, stream=click.get_text_stream("stdout")))
        if dump_dir:
            from qcompiler.passmanager.instrumentation import DumpONNX
            self.list.append(DumpONNX(dump_dir, protect=inputs))

    @staticmethod
    def dump_outputs(passes, dump_dir) -> list:
        """[("--dump-dir", path)] for every file a dump will write (checked with the other outputs, up front)."""
        if dump_dir is None:
            return []
        from qcompiler.passmanager.instrumentation import DumpONNX
        return [("--dump-dir", os.path.join(dump_dir, n)) for n in DumpONNX.file_names(passes)]

    def report(self) -> None:
        if self.verifier is not None:
            for line in self.verifier.log:
                click.echo(f"verify: {line}", err=True)
        if self.timing is not None:
            click.echo(self.timing.report(), err=True)
        if self.statistics is not None:
            click.echo(self.statistics.report(), err=True)


def first_sample(path, what: str):
    """A feeds factory for the Verifier: the first sample of the .npz/.npy at `path`, read for the model it
    verifies (None without a path: random feeds)."""
    if not path:
        return None

    def feeds(model):
        from qcompiler.quant.calibration.data import input_specs, load_samples
        return next(iter(load_samples(path, input_specs(model.graph), limit=1, what=what)))
    return feeds
