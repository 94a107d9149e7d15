"""Reading and writing model files safely: one-line errors, no input overwritten, atomic writes.

Models above 2 GB (protobuf's limit) are written with their tensors in one external-data file beside the model.
External data is read lazily and only from inside the model's own folder.
"""
from __future__ import annotations

import math
import mmap
import os

import onnx
from google.protobuf.message import DecodeError

from qcompiler.arguments import require_model
from qcompiler.errors import (
    InvalidModelError,
    ModelLoadError,
    OutputError,
    QCompilerError,
)
from qcompiler.input_files import check_path_text, open_regular, read_bounded
from qcompiler.ir.model import Model
from qcompiler.ir.tensor import _itemsize
from qcompiler.onnx_io.exporter import (
    ExternalData,
    model_to_byte_pieces,
    model_to_proto,
    write_model,
)
from qcompiler.onnx_io.importer import model_from_proto
from qcompiler.onnx_io.safe_write import (
    Protected,
    check_output_folder,
    data_target,
    model_input_files,
    output_target,
    show,
    write_file,
    write_pair,
    write_through,
)
from qcompiler.onnx_io.tensor_check import short

TWO_GB = 2 ** 31 - 1
# NOTE: the most initializer bytes a model may have to be held as ONE ModelProto (or one protobuf's serialized
# bytes): a session's model up to this goes to onnxruntime as one protobuf, above it tensor by tensor with external
# data (ort_session); a pass that must build one in-memory ModelProto of the weights (weight_mixed_precision's
# evaluation model, head_bits' measure) refuses above it. One fact, not one per caller: protobuf refuses messages
# over TWO_GB, and half of that leaves room for the graph and for the serialized copy a proto is written through
ONE_PROTO_MAX_BYTES = 1 << 30
_WRITE_BUFFER = 1 << 20


def _external_files_of(path: str) -> list:
    """External-data files of the model file at `path`, found before any work; [] when it cannot be read.

    NOTE: every external-data entry carries the key "location", so a file without those bytes has none and is
    not parsed twice (the common case: the model is read again by the command itself). A file that has them is
    loaded (lazily: no weights are read) to learn the files its tensors point at.
    """
    try:
        f = open_regular(path, "model")
    except QCompilerError:
        return []   # not readable as a model: the command's own load reports it
    with f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                if mm.find(b"location") < 0:
                    return []
        except (ValueError, OSError):   # empty file
            return []
    model = load_model(path)
    return [p for p in model_input_files(model) if p != getattr(model, "source_path", None)]


def load_proto(path: str) -> onnx.ModelProto:
    """Parse an ONNX file without loading external data; raise ModelLoadError with a one-line reason.

    The file is opened through `input_files` (a regular file within the model size limit: a FIFO, a device,
    a folder or /dev/zero is one line, never a hang or an unbounded read).
    """
    data = read_bounded(path, "model", ModelLoadError)
    if not data:
        raise ModelLoadError(f"{path}: empty file, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        if "MaxDepth" in str(e):   # If/Loop/Scan bodies nested ~30 deep: parsed as truncated, said as what it is
            raise ModelLoadError(f"{path}: messages nested deeper than protobuf's limit of 100 (If/Loop/Scan "
                                 f"bodies inside each other about 30 deep); refused") from None
        reason = short(str(e).splitlines()[0], 120) if str(e) else "decode error"
        raise ModelLoadError(f"{path}: not an ONNX model or truncated (protobuf parse failed: {reason})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelLoadError(f"{path}: not an ONNX model (no IR version or no graph)")
    return proto


def _model_path(path) -> str:
    """`path` as a str naming a file; anything else (an int, which open() would take as a file descriptor to
    read and close, None, model bytes) is one ModelLoadError line."""
    if isinstance(path, bytes) and (len(path) > 4096 or b"\x00" in path):
        raise ModelLoadError(f"load_model takes a path (str or os.PathLike), got {len(path)} bytes that are not a "
                             f"path; for a serialized model use model_from_proto(onnx.load_from_string(data))")
    try:
        return check_path_text(path, "model", ModelLoadError)
    except TypeError:   # an os.PathLike whose __fspath__ returns neither str nor bytes
        raise ModelLoadError(f"model path must be a str or os.PathLike, got {type(path).__name__}") from None


def load_model(path: str) -> Model:
    """Load an ONNX file into the IR (external data resolved lazily against the file's folder, and only there).

    Every error is one line naming the file; `model.source_path` is the file's absolute path.
    """
    path = _model_path(path)
    proto = load_proto(path)
    try:
        model = model_from_proto(proto, os.path.dirname(os.path.abspath(path)))
    except QCompilerError as e:
        raise type(e)(f"{path}: {e}") from None
    model.source_path = os.path.abspath(path)
    return model


def _total_tensor_bytes(model: Model) -> int:
    """Sum of `Tensor.nbytes` over all initializers (element size looked up once per dtype, not per tensor)."""
    item = {}
    total = 0
    for g in model.graphs():
        for v in g.initializers.values():
            t = v.tensor
            size = item.get(t.dtype)
            if size is None:
                size = item[t.dtype] = _itemsize(t.dtype) or 1
            total += math.prod(t.dims) * size
    return total


def _same_file(a: str, b: str) -> bool:
    """Do `a` and `b` name the same existing file (device and inode, links resolved)?"""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output_paths(outputs, inputs: tuple = (), models: tuple = (), new_folders: "dict | None" = None,
                       model_outputs: tuple = ("-o", "--dump-dir")) -> None:
    """Refuse, before any work, outputs that would land on a file any input reads, collide with each other, or
    cannot be written (folder, FIFO, /proc, missing folder): one line naming the option and both paths.

    `outputs` maps an option name (e.g. "-o", "--encodings") to a path or None, or is a list of such pairs.
    `inputs` are the files the command reads (a folder stands for every file in it: a calibration folder);
    `models` are model files (or loaded models) whose external-data files are protected too. Outputs named in
    `model_outputs` may also write `<path>.data`, which counts as an output. `new_folders` maps an option to a
    folder it creates (e.g. "--dump-dir"); outputs inside it may be in a folder that does not exist yet.
    """
    pairs = list(outputs.items()) if isinstance(outputs, dict) else list(outputs)
    new = set()
    for opt, folder in (new_folders or {}).items():
        if folder is not None:
            new.add(os.path.abspath(check_output_folder(folder, opt)))
    guard = Protected(inputs, models, _external_files_of)
    seen: dict = {}

    def claim(path: str, opt: str) -> None:   # `opt` is also the name used in messages
        keys = [("path", os.path.realpath(path))]
        try:
            st = os.stat(path)
            keys.append(("id", st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass
        for key in keys:
            if key in seen and seen[key] != opt:
                raise OutputError(f"{show(path)}: given for both {seen[key]} and {opt}")
            if key in seen:
                raise OutputError(f"{show(path)}: {opt} names this file twice")
        for key in keys:
            seen[key] = opt

    for opt, path in pairs:
        if path is None:
            continue
        path = check_path_text(path, opt, OutputError)
        missing_ok = os.path.abspath(os.path.dirname(path) or ".") in new
        target = output_target(path, opt, folder_may_be_missing=missing_ok)
        guard.refuse(target.path, opt)
        if target.device:
            continue
        claim(target.path, opt)
        if opt in model_outputs:
            data = target.path + ".data"
            what = f"the external-data file of {opt}"
            data_target(data, what, folder_may_be_missing=missing_ok)
            guard.refuse(data, what)
            claim(data, what)


def save_model(model: Model, path: str, external_data: "bool | None" = None, protect: tuple = ()) -> None:
    """Write `model` to `path` atomically; tensors go to `<file>.data` when over 2 GB or when asked.

    With external data, initializers of 1 KB and more go to `<file>.data` one at a time (page-aligned when over
    1 MB); nothing holds every tensor at once. The switch is automatic when the tensors exceed protobuf's 2 GB
    limit less 1/32 kept for the graph (`external_data=None`).

    Never writes over a file an input reads: the files in `protect` (the CLI passes every input it read), the
    file `model` was loaded from and its external-data files (by identity, links resolved). A character device
    such as /dev/null is written through; any other non-regular output is refused with one line.
    """
    require_model(model, "save_model: model")   # 'str' or a ModelProto: one ArgumentError line, not AttributeError
    target = output_target(path, "output model")
    guard = Protected(protect, models=(model,), external_files_of=_external_files_of)
    guard.refuse(target.path, "the output model")
    # NOTE: protobuf cannot serialize a message over 2 GB; keep 1/32 of that for the graph itself
    use_external = external_data if external_data is not None else \
        _total_tensor_bytes(model) > TWO_GB - TWO_GB // 32
    if use_external:
        if target.device:
            raise OutputError(f"{show(target.path)}: cannot write external data beside a device; give a file path")
        data = target.path + ".data"
        data_target(data, "the output's external-data file")
        guard.refuse(data, "the output's external-data file")
        location = target.base + ".data"

        def write_external(tmp_model: str) -> None:
            # NOTE: tensor by tensor: each one's bytes go to the .data file and are dropped (an external input
            # tensor is streamed from its file, not decoded), so a 2 GB model is never held serialized whole;
            # the .data file was made by write_pair with the umask's permissions, "wb" keeps them
            with open(tmp_model + ".data", "wb", buffering=_WRITE_BUFFER) as data, \
                    open(tmp_model, "wb", buffering=_WRITE_BUFFER) as f:
                write_model(model, f, external=ExternalData(data, location))
        write_pair(target, write_external)
        return

    # NOTE: a 1 MB buffer: with the default 8 KB one, the ~240k pieces of a 90k-node model (most nodes and
    # many tensors under 8 KB) went out in ~24k write calls (now ~190), about 0.1 s of bench_ir's Q
    def write_inline(f) -> None:
        f.writelines(model_to_byte_pieces(model))
    (write_through if target.device else write_file)(target, write_inline)


def write_atomic(path: str, data: "bytes | str", protect: tuple = ()) -> None:
    """Write a small output file (JSON, report) atomically, never over a file in `protect` (by identity)."""
    target = output_target(path, "output")
    Protected(protect).refuse(target.path, "the output")
    payload = data.encode() if isinstance(data, str) else bytes(data)
    (write_through if target.device else write_file)(target, lambda f: f.write(payload))


__all__ = ["load_model", "load_proto", "save_model", "write_atomic", "model_from_proto", "model_to_proto",
           "InvalidModelError"]
