"""The `qcompiler` command line: inspect, run, list-passes, match (and quantize).

Exit codes: 0 success; 2 bad input (not ONNX, truncated, cycle, dangling input, unknown pass or pattern, bad
data, a model onnxruntime refuses): one line on stderr naming the problem, never a traceback; 1 a pass that
fails or breaks the model (one line), or a bug: one line naming the exception and a file holding the full
traceback (`$QCOMPILER_CRASH_DIR`, else the system's temporary folder); 130 interrupted (Ctrl-C). click's own
usage errors keep click's form (usage line, exit 2).
"""
from __future__ import annotations

import atexit
import datetime
import gc
import json
import os
import platform
import sys
import tempfile
import traceback

import click

from qcompiler.cli_instruments import Instruments, examples, first_sample, instrument_options
from qcompiler.errors import PassError, QCompilerError
from qcompiler.shorten import MESSAGE_CHARS
from qcompiler.shorten import one_line as _one_line


def _left_for_exit() -> None:
    """What the command built is left for the operating system to reclaim when the process ends.

    NOTE: a model's IR holds reference cycles (values and their uses), so the collector pass at interpreter exit
    frees it one object at a time: ~0.7 s of CPU after a 90k-node `run` (bench_ir.py). Frozen at exit (the
    atexit hooks run before that pass), it is skipped; in a process that goes on (tests calling `main`) the hook
    waits for that process's own exit.
    """
    atexit.unregister(gc.freeze)   # once, however many commands a process runs
    atexit.register(gc.freeze)


def _fail(msg: str, code: int, prefix: str = "error") -> None:
    click.echo(f"qcompiler: {prefix}: {_one_line(msg)}", err=True)
    sys.exit(code)


def _crash_report(exc: BaseException) -> str:
    """Write the traceback (with the command line and versions) to a new private file; returns its path, or a
    short reason in parentheses why it could not be written."""
    try:
        from importlib.metadata import version
        versions = []
        for pkg in ("qcompiler", "onnx", "onnxruntime", "numpy"):
            try:
                versions.append(f"{pkg} {version(pkg)}")
            except Exception:  # noqa: BLE001 - a missing distribution is no reason to lose the traceback
                versions.append(f"{pkg} ?")
        text = (f"qcompiler internal error\ncommand: {' '.join(map(repr, sys.argv))}\n"
                f"python {platform.python_version()} on {platform.platform()}; {', '.join(versions)}\n\n"
                + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except Exception as e:  # noqa: BLE001 - never a second traceback
        return f"(not saved: {type(e).__name__}: {_one_line(e)[:120]})"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folders = [f for f in (os.environ.get("QCOMPILER_CRASH_DIR"), tempfile.gettempdir()) if f]
    problem = "no folder"
    for folder in folders:
        for k in range(3):
            path = os.path.join(folder, f"qcompiler-crash-{stamp}-{os.getpid()}{f'-{k}' if k else ''}.txt")
            try:
                # NOTE: O_EXCL and O_NOFOLLOW: in a shared /tmp a planted file or symlink of that name is never
                # written through; 0600 because the command line and paths in it are the user's business
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
                    f.write(text)
                return path
            except FileExistsError:
                continue
            except Exception as e:  # noqa: BLE001 - a full disk or a read-only folder: try the next one
                problem = f"{type(e).__name__}: {_one_line(e)[:120]}"
                break
    return f"(not saved: {problem})"


def _internal_error(exc: BaseException) -> None:
    where = _crash_report(exc)
    first = _one_line(exc)[:200]
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    saved = f"full traceback in {where}" if not where.startswith("(") else f"traceback {where[1:-1]}"
    _fail(f"{what}; {saved}", 1, prefix="internal error")


def _broken_pipe() -> None:
    """stdout went to a reader that quit (`qcompiler inspect m.onnx | head`): stop quietly, as `cat` would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(141)   # 128 + SIGPIPE, as a shell reports a process killed by it


def _quantize_command() -> click.Command:
    from qcompiler.cli_quantize import quantize_cmd
    return quantize_cmd


def _debug_command() -> click.Command:
    from qcompiler.cli_debug import debug_cmd
    return debug_cmd


# Commands whose modules load when the command is used (the quantizer and onnxruntime cost more than every other
# command's start-up): name -> (loader, the first paragraph of its help, which `qcompiler --help` shortens as
# click would; tests/cli/test_startup.py keeps it the command's own)
LAZY_COMMANDS = {
    "quantize": (_quantize_command, "Quantize MODEL to QDQ ONNX with one streaming calibration pass over --calib."),
    "debug": (_debug_command, "Compare every quantized value of QUANT with FLOAT on the calibration samples, worst "
                              "first."),
}


class _Group(click.Group):
    _listing = False   # while --help lists the commands: lazy ones show their summary, unloaded

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and name in LAZY_COMMANDS:
            load, summary = LAZY_COMMANDS[name]
            if self._listing:
                return click.Command(name, help=summary)
            cmd = load()
            self.add_command(cmd, name)
        return cmd

    def format_commands(self, ctx, formatter):
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except QCompilerError as e:
            _fail(str(e) if str(e).strip() else type(e).__name__, 2)
        except PassError as e:
            msg = str(e) if str(e).strip() else type(e).__name__
            cause = e.__cause__
            if cause is not None and not isinstance(cause, (PassError, QCompilerError)):
                # a pass crashed (a bug in it): keep the traceback of what it raised
                where = _crash_report(e)
                msg = _one_line(msg)[:MESSAGE_CHARS - 200] + (
                    f"; full traceback in {where}" if not where.startswith("(") else f"; traceback {where[1:-1]}")
            _fail(msg, 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise   # click's usage errors, --help and --version: click prints them its own way
        except MemoryError as e:
            detail = _one_line(e)[:160]
            _fail("ran out of memory" + (f" ({detail})" if detail else ""), 1)
        except BrokenPipeError:
            _broken_pipe()
        except Exception as e:  # noqa: BLE001 - a bug: one line and a file with the traceback, never a traceback
            _internal_error(e)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=examples("qcompiler quantize model.onnx --calib calib.npz -o model.qdq.onnx",
                             "qcompiler inspect model.onnx",
                             "qcompiler list-passes",
                             "qcompiler run model.onnx --pipeline fold-batchnorm,canonicalize -o out.onnx"))
@click.version_option(package_name="qcompiler")
def main():
    """qcompiler: an ONNX compiler built from graph-rewriting passes; post-training quantization to QDQ."""


@main.command("inspect", epilog=examples("qcompiler inspect model.onnx", "qcompiler inspect model.onnx --json"))
@click.argument("model_path", metavar="MODEL")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text")
@click.option("--no-patterns", is_flag=True, help="skip pattern matching")
def inspect_cmd(model_path, as_json, no_patterns):
    """Op histogram, inputs/outputs, shared constants and their readers, subgraphs, pattern matches."""
    from qcompiler.inspect_model import format_inspect, inspect_model
    from qcompiler.onnx_io import load_model
    _left_for_exit()
    info = inspect_model(load_model(model_path), with_patterns=not no_patterns)
    click.echo(json.dumps(info, indent=1) if as_json else format_inspect(info))


@main.command("run", epilog=examples(
    "qcompiler run model.onnx --pipeline fold-batchnorm,canonicalize -o out.onnx",
    "qcompiler run model.onnx --pipeline fold-constants -o out.onnx --verify-each --verify-inputs inputs.npz",
    "qcompiler run model.onnx --pipeline cle -o out.onnx --time-passes --print-after cle"))
@click.argument("model_path", metavar="MODEL")
@click.option("-o", "--output", required=True, metavar="OUT", help="where to write the transformed model")
@click.option("--pipeline", required=True, metavar="PASS[,PASS...]", help="comma-separated pass names (see list-passes)")
@click.option("--verify-inputs", type=click.Path(), metavar="FILE", help=".npz with inputs for --verify-each (default: random)")
@instrument_options
def run_cmd(model_path, output, pipeline, verify_inputs, **flags):
    """Run a pipeline of passes over MODEL and write the result to OUTPUT."""
    from qcompiler.onnx_io import load_model, save_model
    from qcompiler.onnx_io.files import check_output_paths
    from qcompiler.passmanager import PassManager
    pm = PassManager(pipeline)  # unknown pass names and broken contracts fail before the model is read
    inputs = (model_path, verify_inputs)
    outputs = [("-o", output)] + Instruments.dump_outputs(pm.passes, flags["dump_dir"])
    _left_for_exit()
    # NOTE: the model is read before the outputs are checked, and the check takes the loaded model: its
    # external-data files are then known from the import itself, where a model given as a path costs a scan of
    # the whole file for external-data entries first (~0.1 s for 200 MB). Nothing is written before the check.
    model = load_model(model_path)
    check_output_paths(outputs, inputs, models=(model,), new_folders={"--dump-dir": flags["dump_dir"]})
    instruments = Instruments(pm.passes, inputs, feeds_name=verify_inputs,
                              feeds_factory=first_sample(verify_inputs, "verification inputs"), **flags)
    for inst in instruments.list:
        pm.add_instrumentation(inst)
    from qcompiler.ort_session import model_label
    with model_label(model_path):   # onnxruntime's refusals of the input (--verify-each) name MODEL
        pm.run(model)
    save_model(model, output, protect=inputs)
    instruments.report()
    click.echo(f"wrote {output}", err=True)


@main.command("list-passes", epilog=examples("qcompiler list-passes"))
def list_passes_cmd():
    """List the registered passes (built-in and plug-ins): graph passes for `run`, then the quantization passes
    for `quantize` (the default pipeline in its order, then the optional ones for --recipe)."""
    from qcompiler.passmanager import available_passes
    from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE
    passes = available_passes()
    quant = {n: c for n, c in passes.items() if "quant-context" in getattr(c, "requires", ())}

    def row(name, cls, extra=""):
        tag = "" if getattr(cls, "preserves_semantics", True) else "  [changes semantics]"
        click.echo(f"  {name:<26}{getattr(cls, 'description', '')}{tag}{extra}")
    click.echo("graph passes (qcompiler run --pipeline a,b,c):")
    for name, cls in passes.items():
        if name not in quant:
            row(name, cls)
    click.echo("default pipeline of `qcompiler quantize`, in order (graph passes are described above):")
    for name in DEFAULT_PIPELINE:
        if name in quant:
            row(name, quant[name])
        else:
            click.echo(f"  {name:<26}(graph pass)")
    click.echo("optional passes (qcompiler quantize --recipe a,b; each runs right after the pass it names):")
    for name, cls in passes.items():
        if name not in DEFAULT_PIPELINE and (name in quant or getattr(cls, "after", "")):
            row(name, cls, f"  [after {cls.after}]" if getattr(cls, "after", "") else "  [--pipeline only]")
    from qcompiler.passmanager.registry import BROKEN_PLUGINS
    for name, why in BROKEN_PLUGINS.items():
        click.echo(f"qcompiler: warning: plug-in '{name}' failed to load: {why}", err=True)


@main.command("match", epilog=examples("qcompiler match model.onnx list", "qcompiler match model.onnx layernorm",
                                      "qcompiler match model.onnx gelu --explain /mlp/act/Mul"))
@click.argument("model_path", metavar="MODEL")
@click.argument("pattern")
@click.option("--explain", "explain_node", metavar="NODE", help="explain why NODE is or is not the root of a match")
@click.option("--json", "as_json", is_flag=True, help="print the matches as one JSON list")
def match_cmd(model_path, pattern, explain_node, as_json):
    """Find the matches of PATTERN (see `qcompiler match MODEL list`) in MODEL."""
    from qcompiler.onnx_io import load_model
    from qcompiler.patterns import all_patterns, explain, find_matches, get_pattern
    if pattern == "list":
        for name, pats in all_patterns().items():
            click.echo(f"{name:<20}" + ", ".join(p.name for p in pats))
        return
    get_pattern(pattern)  # unknown names raise PatternError listing the known ones
    _left_for_exit()
    model = load_model(model_path)
    if explain_node:
        node = next((n for g in model.graphs() for n in g if n.name == explain_node), None)
        if node is None:
            from qcompiler.errors import QCompilerError as _E
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


if __name__ == "__main__":  # pragma: no cover
    main()
