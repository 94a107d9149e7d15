"""A fork server for the hostile suite: import qcompiler (and onnxruntime) once, then fork one child per command.

Started by `harness.ForkServer` as `python forkserver.py`; reads one JSON request per line on stdin
(`{"args": [...], "cwd": ..., "timeout": s, "mem": bytes, "cpu": s, "umask": int}`) and answers one JSON line
on stdout (`rc`, `signal`, `timeout`, `elapsed`, `stdout`, `stderr`). Each child is a fresh fork of the same
pre-imported state, so runs cannot leak into each other; it runs `qcompiler.cli.main` as `python -m qcompiler`
would (SystemExit code, an uncaught exception prints its traceback and exits 1, atexit handlers run), in its own
session, with RLIMIT_AS/RLIMIT_CPU set, stdin from /dev/null and stdout/stderr into files. A run over its wall
timeout is SIGKILLed (its whole process group) and reported as a timeout.

This saves the ~0.5 s import of onnxruntime per run, so the default suite can afford a mutant set worth having.
`QC_HOSTILE_FORK=0` makes the harness use a plain `python -m qcompiler` subprocess per run instead.
"""
import atexit
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback


def _child(req: dict, out_path: str, err_path: str) -> None:
    code = 1
    try:
        os.setsid()
        os.umask(req.get("umask", 0o022))
        if req.get("mem"):
            resource.setrlimit(resource.RLIMIT_AS, (req["mem"], req["mem"]))
        if req.get("cpu"):
            resource.setrlimit(resource.RLIMIT_CPU, (req["cpu"], req["cpu"] + 5))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(req["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(os.open(out_path, os.O_WRONLY | os.O_TRUNC), 1)
        os.dup2(os.open(err_path, os.O_WRONLY | os.O_TRUNC), 2)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        sys.argv = ["qcompiler", *req["args"]]
        try:
            from qcompiler.cli import main
            main(args=list(req["args"]), prog_name="qcompiler")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code & 0xFF)


def serve() -> None:
    import importlib
    for name in ("qcompiler.cli", "qcompiler.quant.api", "qcompiler.cli_quantize", "onnxruntime"):
        try:  # the expensive imports, done once; a module that moved only costs its import in each child
            importlib.import_module(name)
        except ImportError:
            pass
    tmp = tempfile.mkdtemp(prefix="qc-forkserver-")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    reply = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        req = json.loads(line)
        for p in (out_path, err_path):
            open(p, "wb").close()
        sys.stderr.flush()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(req, out_path, err_path)
        deadline = t0 + req.get("timeout", 20)
        timed_out, status = False, 0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                    try:
                        target()
                    except OSError:
                        pass
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        elapsed = time.monotonic() - t0
        try:  # the child's own children (if any) go with it
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        with open(out_path, "rb") as f:
            out = f.read(1 << 20)
        with open(err_path, "rb") as f:
            err = f.read(1 << 20)
        rc = os.waitstatus_to_exitcode(status)
        reply.write(json.dumps({"rc": rc, "timeout": timed_out, "elapsed": elapsed,
                                "stdout": out.decode("utf-8", "replace"),
                                "stderr": err.decode("utf-8", "replace")}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()
