"""The `qcompiler` command line: inspect, run, list-passes, match (and quantize).

Bad input (not ONNX, truncated, cycle, dangling input, unknown pass or pattern, bad data) gets one line on
stderr naming the problem and exit code 2, never a traceback; a pass that fails or breaks the model exits 1.
"""
from __future__ import annotations

import json
import os
import sys

import click

from .errors import PassError, QCompilerError


def _fail(msg: str, code: int) -> None:
    click.echo(f"qcompiler: error: {msg}", err=True)
    sys.exit(code)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except QCompilerError as e:
            _fail(str(e).splitlines()[0] if str(e) else type(e).__name__, 2)
        except PassError as e:
            _fail(str(e).splitlines()[0], 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qcompiler")
def main():
    """qcompiler: an ONNX compiler built from graph-rewriting passes; post-training quantization to QDQ."""


@main.command("inspect")
@click.argument("model_path", metavar="MODEL")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text")
@click.option("--no-patterns", is_flag=True, help="skip pattern matching")
def inspect_cmd(model_path, as_json, no_patterns):
    """Op histogram, inputs/outputs, shared constants and their readers, subgraphs, pattern matches."""
    from .inspect_model import format_inspect, inspect_model
    from .onnx_io import load_model
    info = inspect_model(load_model(model_path), with_patterns=not no_patterns)
    click.echo(json.dumps(info, indent=1) if as_json else format_inspect(info))


@main.command("run")
@click.argument("model_path", metavar="MODEL")
@click.option("-o", "--output", required=True, help="where to write the transformed model")
@click.option("--pipeline", required=True, help="comma-separated pass names (see list-passes)")
@click.option("--verify-each", is_flag=True, help="after each pass: IR invariants, onnx.checker, and onnxruntime outputs for semantics-preserving passes")
@click.option("--verify-inputs", type=click.Path(), help=".npz with inputs for --verify-each (default: random)")
@click.option("--print-after", "print_after", multiple=True, help="print the IR after this pass ('all' for every pass)")
@click.option("--dump-dir", type=click.Path(), help="write the ONNX model after each pass into this folder")
@click.option("--time-passes", is_flag=True, help="print the wall time of each pass")
@click.option("--stats", is_flag=True, help="print each pass's statistics")
def run_cmd(model_path, output, pipeline, verify_each, verify_inputs, print_after, dump_dir, time_passes, stats):
    """Run a pipeline of passes over MODEL and write the result to OUTPUT."""
    from .onnx_io import load_model, save_model
    from .passmanager import PassManager
    from .passmanager.instrumentation import DumpONNX, PrintIR, Statistics, Timing, Verifier
    from .onnx_io.files import check_output_paths
    pm = PassManager(pipeline)  # unknown pass names fail before the model is read
    inputs = (model_path, verify_inputs)
    outputs = [("-o", output)]
    if dump_dir is not None:   # every dump is an output too, checked now rather than after some passes ran
        outputs += [("--dump-dir", os.path.join(dump_dir, n)) for n in DumpONNX.file_names(pm.passes)]
    check_output_paths(outputs, inputs, models=(model_path,), new_folders={"--dump-dir": dump_dir})
    model = load_model(model_path)
    timing, statistics, verifier = Timing(), Statistics(), None
    if verify_each:
        feeds = None
        if verify_inputs:
            from .quant.data import input_specs, load_samples
            feeds = next(iter(load_samples(verify_inputs, input_specs(model.graph))))
        verifier = Verifier(feeds=feeds)
        pm.add_instrumentation(verifier)
    if time_passes:
        pm.add_instrumentation(timing)
    if stats:
        pm.add_instrumentation(statistics)
    if print_after:
        pm.add_instrumentation(PrintIR(print_after))
    if dump_dir:
        pm.add_instrumentation(DumpONNX(dump_dir, protect=inputs))
    pm.run(model)
    save_model(model, output, protect=inputs)
    if verifier is not None:
        for line in verifier.log:
            click.echo(f"verify: {line}", err=True)
    if time_passes:
        click.echo(timing.report(), err=True)
    if stats:
        click.echo(statistics.report(), err=True)
    click.echo(f"wrote {output}", err=True)


@main.command("list-passes")
def list_passes_cmd():
    """List the registered passes (built-in and plug-ins)."""
    from .passmanager import available_passes
    for name, cls in available_passes().items():
        tag = "" if getattr(cls, "preserves_semantics", True) else "  [changes semantics]"
        click.echo(f"{name:<26}{getattr(cls, 'description', '')}{tag}")


@main.command("match")
@click.argument("model_path", metavar="MODEL")
@click.argument("pattern")
@click.option("--explain", "explain_node", metavar="NODE", help="explain why NODE is or is not the root of a match")
@click.option("--json", "as_json", is_flag=True)
def match_cmd(model_path, pattern, explain_node, as_json):
    """Find the matches of PATTERN (see `qcompiler match MODEL list`) in MODEL."""
    from .onnx_io import load_model
    from .patterns import all_patterns, explain, find_matches, get_pattern
    if pattern == "list":
        for name, pats in all_patterns().items():
            click.echo(f"{name:<20}" + ", ".join(p.name for p in pats))
        return
    get_pattern(pattern)  # unknown names raise PatternError listing the known ones
    model = load_model(model_path)
    if explain_node:
        node = next((n for g in model.graphs() for n in g if n.name == explain_node), None)
        if node is None:
            from .errors import QCompilerError as _E
            raise _E(f"{model_path}: no node named '{explain_node}'")
        click.echo(explain(node.graph, pattern, node))
        return
    rows = [{"graph": m.root.graph.name, "root": m.root.name, "pattern": m.pattern,
             "nodes": [n.name for n in m.nodes]} for m in find_matches(model.graph, pattern)]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{len(rows)} match(es) of '{pattern}'")
    for r in rows:
        click.echo(f"  {r['root']}: " + " -> ".join(r["nodes"]))


def _register_commands():
    from .quant.cli_quantize import quantize_cmd
    main.add_command(quantize_cmd, "quantize")


_register_commands()

if __name__ == "__main__":  # pragma: no cover
    main()
