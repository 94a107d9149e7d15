"""No output lands on a file an input reads, however it is named; outputs that are not regular files are written
through (character devices) or refused with one line; atomic writes keep the umask's permissions.

Every refusal happens before any work: exit 2, one line naming the option and the input, inputs unchanged.
"""
from __future__ import annotations

import hashlib
import os
import socket
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest

import qcompiler
from qcompiler.errors import OutputError, QCompilerError
from qcompiler.onnx_io import files, safe_write, write_atomic
from qcompiler.onnx_io.safe_write import output_target
from tests.helpers import assert_one_line_error


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def qc(*args, cwd=None):
    """The CLI in this process (click's runner): a real process per case would make this file slow."""
    from click.testing import CliRunner
    from qcompiler.cli import main
    old = os.getcwd()
    os.chdir(cwd or old)
    try:
        r = CliRunner().invoke(main, list(args), catch_exceptions=True)
    finally:
        os.chdir(old)
    err = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        import traceback
        err += "Traceback\n" + "".join(traceback.format_exception(*r.exc_info))
    return _Result(r.exit_code, r.stdout, err)


def qc_process(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "qcompiler", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def digest(folder) -> dict:
    """Hash of every file under `folder` (links not followed): what must not change."""
    out = {}
    for dirpath, dirs, names in os.walk(folder):
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out[p] = (st.st_ino, hashlib.sha256(open(p, "rb").read()).hexdigest())
            else:
                out[p] = (st.st_ino, stat.S_IFMT(st.st_mode))
    return out


@pytest.fixture
def work(tiny, tmp_path):
    """A fresh copy of the tiny model, its calibration set, and a copy saved with external data."""
    for n in ("tiny_cnn.onnx", "tiny_cnn_calib.npz"):
        (tmp_path / n).write_bytes((tiny / n).read_bytes())
    (tmp_path / "ext").mkdir()
    onnx.save_model(onnx.load(str(tiny / "tiny_cnn.onnx")), str(tmp_path / "ext" / "m.onnx"),
                    save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                    size_threshold=0)
    return tmp_path


RUN = ("--pipeline", "canonicalize")


# --- run -o: every way of naming an input ----------------------------------------------------------------------
def _trick(work, name):
    """(cli args, what the message names) for one way of naming an input as the output."""
    m = str(work / "tiny_cnn.onnx")
    if name == "dotdot":
        (work / "sub").mkdir()
        return ["run", m, "-o", str(work / "sub" / ".." / "tiny_cnn.onnx"), *RUN], "-o would overwrite"
    if name == "hard_link":
        os.link(m, work / "link.onnx")
        return ["run", m, "-o", str(work / "link.onnx"), *RUN], "tiny_cnn.onnx"
    if name == "symlink_to_input":
        os.symlink(m, work / "link.onnx")
        return ["run", m, "-o", str(work / "link.onnx"), *RUN], "tiny_cnn.onnx"
    if name == "input_is_symlink":
        os.symlink(m, work / "link.onnx")
        return ["run", str(work / "link.onnx"), "-o", m, *RUN], "link.onnx"
    if name == "relative_from_other_cwd":
        return ["run", "tiny_cnn.onnx", "-o", m, *RUN], "-o would overwrite"
    if name == "external_data_file":
        return ["run", str(work / "ext" / "m.onnx"), "-o", str(work / "ext" / "weights.bin"), *RUN], "external data"
    if name == "external_data_of_output":
        os.symlink(work / "ext" / "weights.bin", work / "out.onnx.data")
        return ["run", str(work / "ext" / "m.onnx"), "-o", str(work / "out.onnx"), *RUN], "external-data file of -o"
    if name == "verify_inputs":
        return ["run", m, "-o", str(work / "tiny_cnn_calib.npz"), "--verify-each", "--verify-inputs",
                str(work / "tiny_cnn_calib.npz"), *RUN], "tiny_cnn_calib.npz"
    if name == "dump_dir_holds_input":
        (work / "dumps").mkdir()
        os.link(m, work / "dumps" / "01_canonicalize.onnx")
        return ["run", m, "-o", str(work / "out.onnx"), "--dump-dir", str(work / "dumps"), *RUN], "--dump-dir"
    if name == "dump_dir_is_input_folder":
        os.rename(m, work / "00_input.onnx")
        return ["run", str(work / "00_input.onnx"), "-o", str(work / "out.onnx"), "--dump-dir", str(work), *RUN], \
            "--dump-dir would overwrite"
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["dotdot", "hard_link", "symlink_to_input", "input_is_symlink",
                                  "relative_from_other_cwd", "external_data_file", "external_data_of_output",
                                  "verify_inputs", "dump_dir_holds_input", "dump_dir_is_input_folder"])
def test_run_refuses_every_name_of_an_input(work, name):
    args, needle = _trick(work, name)
    before = digest(work)
    r = qc(*args, cwd=str(work))
    line = assert_one_line_error(r, needle)
    assert "would overwrite the input file" in line or "given for both" in line, line
    assert digest(work) == before, "nothing written, nothing replaced"
    assert not os.path.exists(work / "out.onnx")


def test_refusals_through_a_real_process(work):
    (work / "sub").mkdir()
    before = digest(work)
    assert_one_line_error(qc_process("run", "tiny_cnn.onnx", "-o", "sub/../tiny_cnn.onnx", *RUN, cwd=str(work)),
                   "-o would overwrite the input file 'tiny_cnn.onnx'")
    os.link(work / "tiny_cnn_calib.npz", work / "alias.npz")
    assert_one_line_error(qc_process("quantize", "tiny_cnn.onnx", "--calib", ".", "-o", "alias.npz", cwd=str(work)),
                   "-o would overwrite the input file", "(in the folder '.')")
    assert_one_line_error(qc_process("run", "ext/m.onnx", "-o", "ext/weights.bin", *RUN, cwd=str(work)),
                   "external data of 'ext/m.onnx'")
    os.unlink(work / "alias.npz")
    assert digest(work) == before


def _quantize_inputs(work):
    (work / "cal").mkdir()
    np.savez(work / "cal" / "a.npz", image=np.random.default_rng(0).random((4, 1, 3, 16, 16)).astype(np.float32))
    (work / "cfg.yaml").write_text("defaults: {per_channel: true}\n")
    (work / "prof.yaml").write_text("base: ort_cpu\n")
    (work / "enc.json").write_text('{"version": "1.0.0", "activation_encodings": [], "param_encodings": []}\n')


@pytest.mark.parametrize("opt,victim", [("-o", "cal/a.npz"), ("--report", "cal/a.npz"), ("--encodings", "cfg.yaml"),
                                        ("-o", "prof.yaml"), ("--report", "enc.json"), ("-o", "ext/weights.bin"),
                                        ("--report", "ext/m.onnx")])
def test_quantize_refuses_every_input_file(work, opt, victim):
    _quantize_inputs(work)
    args = ["quantize", "ext/m.onnx", "--calib", "cal", "--config", "cfg.yaml", "--target", "prof.yaml",
            "--load-encodings", "enc.json", "-o", "q.onnx"]
    if opt == "-o":
        args[-1] = victim
    else:
        args += [opt, victim]
    os.link(work / victim, work / "alias")   # the same file by another name must be refused as well
    before = digest(work)
    assert_one_line_error(qc(*args, cwd=str(work)), f"{opt} would overwrite the input file")
    args[len(args) - 1 - args[::-1].index(victim)] = "alias"   # the output, not an input spelled the same
    assert_one_line_error(qc(*args, cwd=str(work)), "would overwrite the input file")
    assert digest(work) == before
    assert not os.path.exists(work / "q.onnx")


def test_outputs_of_one_command_do_not_collide(work):
    m, cal = str(work / "tiny_cnn.onnx"), str(work / "tiny_cnn_calib.npz")
    (work / "r.json").write_text("{}")
    (work / "sub").mkdir()
    os.link(work / "r.json", work / "e.json")
    before = digest(work)
    assert_one_line_error(qc("quantize", m, "--calib", cal, "-o", "q.onnx", "--report", "r.json", "--encodings", "e.json",
                      cwd=str(work)), "given for both")
    assert_one_line_error(qc("quantize", m, "--calib", cal, "-o", "q.onnx", "--report", "q.onnx.data", cwd=str(work)),
                   "external-data file of -o")
    assert_one_line_error(qc("quantize", m, "--calib", cal, "-o", "q.onnx", "--report", "./sub/../q.onnx",
                      cwd=str(work)), "given for both")
    assert_one_line_error(qc("run", m, "-o", "d/01_canonicalize.onnx", "--dump-dir", "d", *RUN, cwd=str(work)),
                   "given for both")
    assert digest(work) == before and not os.path.exists(work / "d")


# --- what kind of file the output is ---------------------------------------------------------------------------
def test_dev_null_is_written_through_by_decision():
    # NOTE: never rename over the real /dev/null in a test; the decision is what keeps it a device
    t = output_target("/dev/null", "-o")
    assert t.device
    qcompiler.save_model(qcompiler.model_from_proto(onnx.helper.make_model(onnx.helper.make_graph(
        [], "g", [], []))), "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def _null_device(path) -> bool:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with open(path, "wb") as f:
            f.write(b"x")
        return True
    except (PermissionError, OSError):
        if os.path.lexists(path):
            os.unlink(path)
        return False


def test_character_device_output_is_written_through_not_replaced(work):
    dev = work / "null"
    if not _null_device(str(dev)):
        pytest.skip("cannot make a device node here")
    ino = os.stat(dev).st_ino
    r = qc("run", "tiny_cnn.onnx", "-o", "null", *RUN, cwd=str(work))
    assert r.returncode == 0, r.stderr
    r = qc("quantize", "tiny_cnn.onnx", "--calib", "tiny_cnn_calib.npz", "-o", "null", "--report", "null",
           "--encodings", "null", cwd=str(work))
    assert r.returncode == 0, r.stderr
    st = os.stat(dev)
    assert stat.S_ISCHR(st.st_mode) and st.st_ino == ino, "the device is still the device"
    assert not [n for n in os.listdir(work) if n.startswith(".")]


@pytest.mark.parametrize("kind", ["fifo", "socket", "folder", "trailing_slash", "empty", "proc", "sys",
                                  "missing_folder", "under_a_file"])
def test_output_that_is_not_a_regular_file_is_one_line(work, kind):
    sock = None
    if kind == "fifo":
        os.mkfifo(work / "out")
        out, needle = "out", "is a FIFO"
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(work / "out"))
        out, needle = "out", "is a socket"
    elif kind == "folder":
        (work / "out").mkdir()
        out, needle = "out", "is a folder"
    elif kind == "trailing_slash":
        out, needle = "newname/", "names a folder"
    elif kind == "empty":
        out, needle = "", "path is empty"
    elif kind == "proc":
        out, needle = "/proc/self/comm", "/proc"
    elif kind == "sys":
        out, needle = "/sys/kernel/qcompiler.onnx", "/sys"
    elif kind == "missing_folder":
        out, needle = "no/such/out.onnx", "does not exist"
    else:
        out, needle = "tiny_cnn_calib.npz/out.onnx", "not a folder"
    before = digest(work)
    try:
        assert_one_line_error(qc("run", "tiny_cnn.onnx", "-o", out, *RUN, cwd=str(work)), needle)
        assert_one_line_error(qc("quantize", "tiny_cnn.onnx", "--calib", "tiny_cnn_calib.npz", "-o", "q.onnx",
                          "--report", out, cwd=str(work)), needle)
    finally:
        if sock is not None:
            sock.close()
    assert digest(work) == before


@pytest.mark.parametrize("kind", ["file", "proc", "under_a_file", "fifo"])
def test_dump_dir_that_cannot_be_a_folder_is_one_line(work, kind):
    if kind == "file":
        d, needle = "tiny_cnn_calib.npz", "is a file, not a folder"
    elif kind == "proc":
        d, needle = "/proc/self/qcompiler_dumps", "/proc"
    elif kind == "under_a_file":
        d, needle = "tiny_cnn_calib.npz/dumps", "cannot be"
    else:
        os.mkfifo(work / "fifo")
        d, needle = "fifo", "is a FIFO"
    before = digest(work)
    assert_one_line_error(qc("run", "tiny_cnn.onnx", "-o", "out.onnx", "--dump-dir", d, *RUN, cwd=str(work)), needle)
    assert digest(work) == before and not os.path.exists(work / "out.onnx")


def test_dump_dir_is_made_and_filled(work):
    r = qc("run", "tiny_cnn.onnx", "-o", "out.onnx", "--dump-dir", "a/b", "--pipeline", "canonicalize,fold-batchnorm",
           cwd=str(work))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(work / "a" / "b")) == ["00_input.onnx", "01_canonicalize.onnx", "02_fold-batchnorm.onnx"]


# --- the Python API -------------------------------------------------------------------------------------------
def test_save_model_never_writes_over_the_inputs_external_data(work):
    """out.onnx.data was the input's external-data file, and the input no longer loaded."""
    src = work / "ext" / "m.onnx"
    os.rename(work / "ext" / "weights.bin", work / "ext" / "out.onnx.data")
    proto = onnx.load(str(src), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "out.onnx.data"
    src.write_bytes(proto.SerializeToString())
    before = digest(work)
    m = qcompiler.load_model(str(src))
    with pytest.raises(OutputError, match="out.onnx.data.*would overwrite the input file"):
        files.save_model(m, str(work / "ext" / "out.onnx"), external_data=True, protect=(str(src),))
    with pytest.raises(OutputError, match="would overwrite the input file"):   # protected by default too
        files.save_model(m, str(work / "ext" / "out.onnx"), external_data=True)
    with pytest.raises(OutputError, match="would overwrite the input file"):
        files.save_model(m, str(work / "ext" / "out.onnx.data"))
    assert digest(work) == before
    onnx.checker.check_model(str(src), full_check=True)   # the input still loads, with its data


def test_save_model_protects_the_file_the_model_came_from(work):
    src = str(work / "tiny_cnn.onnx")
    m = qcompiler.load_model(src)
    m.source_path = src   # set by load_model itself ; set here so this test stands alone
    os.link(src, work / "alias.onnx")
    before = digest(work)
    for out in (src, str(work / "alias.onnx"), str(work / "." / "tiny_cnn.onnx")):
        with pytest.raises(OutputError, match="would overwrite the input file"):
            qcompiler.save_model(m, out)
    assert digest(work) == before
    qcompiler.save_model(m, str(work / "copy.onnx"))
    assert onnx.load(str(work / "copy.onnx")).graph.node


def test_quantize_result_save_protects_its_source(work):
    from qcompiler.quant.api import quantize
    src = str(work / "tiny_cnn.onnx")
    res = quantize(src, str(work / "tiny_cnn_calib.npz"), limit=4)
    if getattr(res.model, "source_path", None) is None:
        res.model.source_path = src   # set by load_model itself
    before = digest(work)
    with pytest.raises(OutputError, match="would overwrite the input file"):
        res.save(src)
    with pytest.raises(OutputError, match="would overwrite the input file"):
        res.write_encodings(src)
    with pytest.raises(OutputError, match="would overwrite the input file"):
        res.save(str(work / "tiny_cnn_calib.npz"), protect=(str(work / "tiny_cnn_calib.npz"),))
    assert digest(work) == before
    res.save(str(work / "q2.onnx"))
    import onnxruntime as ort
    x = np.load(str(work / "tiny_cnn_calib.npz"))["image"][0]
    ort.InferenceSession(str(work / "q2.onnx"), providers=["CPUExecutionProvider"]).run(None, {"image": x})


def test_api_argument_errors_are_our_kinds(work):
    with pytest.raises(QCompilerError, match="qcompiler Model"):
        qcompiler.save_model("model.onnx", str(work / "x.onnx"))
    m = qcompiler.load_model(str(work / "tiny_cnn.onnx"))
    with pytest.raises(OutputError, match="is a folder"):
        qcompiler.save_model(m, str(work))
    with pytest.raises(OutputError, match="path is empty"):
        qcompiler.save_model(m, "")
    with pytest.raises(OutputError, match="NUL"):
        qcompiler.save_model(m, "a\x00b")
    os.mkfifo(work / "fifo")
    with pytest.raises(OutputError, match="FIFO"):
        write_atomic(str(work / "fifo"), "{}")
    with pytest.raises(OutputError, match="would overwrite"):
        write_atomic(str(work / "tiny_cnn_calib.npz"), "{}", protect=(str(work),))   # a folder protects its files
    with pytest.raises(OutputError, match="would overwrite"):
        write_atomic(str(work / "tiny_cnn_calib.npz"), "{}", protect=str(work / "tiny_cnn_calib.npz"))   # one path
    with pytest.raises(OutputError, match="device"):
        qcompiler.save_model(m, "/dev/null", external_data=True)
    os.mkfifo(work / "x.onnx.data")
    with pytest.raises(OutputError, match="x.onnx.data: the output's external-data file is a FIFO"):
        qcompiler.save_model(m, str(work / "x.onnx"), external_data=True)
    with pytest.raises(OutputError, match="must be a str"):
        files.check_output_paths({"-o": 5}, ())
    assert not os.path.exists(work / "x.onnx")


# --- permissions ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_outputs_get_the_umask_permissions(work, umask):
    m = qcompiler.load_model(str(work / "ext" / "m.onnx"))
    old = os.umask(umask)
    try:
        qcompiler.save_model(m, str(work / "inline.onnx"))
        qcompiler.save_model(m, str(work / "external.onnx"), external_data=True)
        write_atomic(str(work / "report.json"), "{}\n")
        qcompiler.save_model(m, str(work / "inline.onnx"))   # replacing an existing output: same rule
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    for n in ("inline.onnx", "external.onnx", "external.onnx.data", "report.json"):
        assert stat.S_IMODE(os.stat(work / n).st_mode) == want, (n, oct(os.stat(work / n).st_mode), oct(want))
    assert not [n for n in os.listdir(work) if n.startswith(".")]


def test_cli_outputs_get_the_umask_permissions(work):
    r = subprocess.run(f"umask 027 && {sys.executable} -m qcompiler quantize tiny_cnn.onnx --calib tiny_cnn_calib.npz"
                       " -o q.onnx --report r.json --encodings e.json --limit 4", shell=True, cwd=str(work),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for n in ("q.onnx", "r.json", "e.json"):
        assert stat.S_IMODE(os.stat(work / n).st_mode) == 0o640, n


# --- leftovers --------------------------------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_write_removes_leftovers_of_dead_runs_only(work):
    dead, alive = _dead_pid(), os.getppid()
    own = safe_write._OWNER
    names = {
        "dead_file": f".out.onnx.qcompiler-{dead}-{own}-0badc0de.tmp",
        "dead_dir": f".other.onnx.qcompiler-{dead}-{own}-0badc0df.tmp",
        "alive": f".out.onnx.qcompiler-{alive}-{own}-0badc0de.tmp",
        "other_host": f".out.onnx.qcompiler-{dead}-{'0' * 6 if own != '0' * 6 else '1' * 6}-0badc0de.tmp",
        "not_ours": f".out.onnx.{dead}.tmp",
        "stale_lock": ".out.onnx.qcompiler.lock",
    }
    for k, n in names.items():
        if k == "dead_dir":
            (work / n).mkdir()
            (work / n / "other.onnx.data").write_bytes(b"x" * 10)
        else:
            (work / n).write_bytes(b"partial")
    qcompiler.save_model(qcompiler.load_model(str(work / "tiny_cnn.onnx")), str(work / "out.onnx"))
    left = set(os.listdir(work))
    for k in ("dead_file", "dead_dir", "stale_lock"):
        assert names[k] not in left, k
    for k in ("alive", "other_host", "not_ours"):
        assert names[k] in left, k


def test_run_checks_outputs_against_the_loaded_model_without_scanning_the_file(work, monkeypatch):
    """`run` reads the model once: its external-data files come from the import, not from a scan of the file
    before it (which cost ~0.1 s per 200 MB); the refusals stay the same."""
    def no_scan(path):
        raise AssertionError(f"run scanned {path} for external data")
    monkeypatch.setattr(files, "_external_files_of", no_scan)
    before = digest(work)
    assert_one_line_error(qc("run", "ext/m.onnx", "-o", "ext/weights.bin", *RUN, cwd=str(work)),
                          "-o would overwrite the input file", "external data of 'ext/m.onnx'")
    assert_one_line_error(qc("run", "ext/m.onnx", "-o", "ext/m.onnx", *RUN, cwd=str(work)),
                          "-o would overwrite the input file")
    assert digest(work) == before
    r = qc("run", "ext/m.onnx", "-o", "out.onnx", *RUN, cwd=str(work))
    assert r.returncode == 0, r.stderr
    m = onnx.load(str(work / "out.onnx"))
    assert len(m.graph.initializer) == len(onnx.load(str(work / "ext" / "m.onnx"), load_external_data=False)
                                          .graph.initializer) > 0
