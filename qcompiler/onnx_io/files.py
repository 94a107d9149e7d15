"""Reading and writing model files safely: one-line errors, no input overwritten, atomic writes.

Models above 2 GB (protobuf's limit) are written with their tensors in one external-data file beside the model.
External data is read lazily and only from inside the model's own folder.
"""
from __future__ import annotations

import math
import os
import tempfile

import onnx
from google.protobuf.message import DecodeError

from ..errors import InvalidModelError, ModelLoadError, QCompilerError
from ..ir.model import Model
from ..input_files import check_path_text, read_bounded
from ..ir.tensor import _itemsize
from .exporter import model_to_byte_pieces, model_to_proto
from .importer import model_from_proto
from .tensor_check import short

TWO_GB = 2 ** 31 - 1
_WRITE_BUFFER = 1 << 20


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
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def check_output_paths(outputs: dict, inputs: tuple) -> None:
    """Refuse, before any work, outputs that would overwrite an input file, collide, or go to a missing folder.

    `outputs` maps an option name (e.g. "-o", "--encodings") to a path or None.
    """
    seen: dict = {}
    for opt, path in outputs.items():
        if not path:
            continue
        for p in inputs:
            if p and (_same_file(p, path) or os.path.abspath(p) == os.path.abspath(path)):
                raise QCompilerError(f"{path}: {opt} would overwrite the input file '{p}'; choose another path")
        key = os.path.abspath(path)
        if key in seen:
            raise QCompilerError(f"{path}: given for both {seen[key]} and {opt}")
        seen[key] = opt
        folder = os.path.dirname(key) or "."
        if not os.path.isdir(folder):
            raise QCompilerError(f"{path}: output folder '{folder}' does not exist")


def _output_folder(path: str, protect: tuple, what: str) -> str:
    """The existing folder `path` will be written in; refuses a path that is one of the `protect` files."""
    for p in protect:
        if p and _same_file(p, path):
            raise QCompilerError(f"{path}: refusing to overwrite {what}; choose another output path")
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise QCompilerError(f"{path}: output folder '{folder}' does not exist")
    return folder


def save_model(model: Model, path: str, external_data: "bool | None" = None, protect: tuple = ()) -> None:
    """Write `model` to `path` atomically; tensors go to `<file>.data` when over 2 GB or when asked.

    `protect` lists input files that must never be overwritten (the CLI passes the model it read).
    """
    folder = _output_folder(path, protect, "the input model")
    # NOTE: protobuf cannot serialize a message over 2 GB; keep 1/32 of that for the graph itself
    use_external = external_data if external_data is not None else \
        _total_tensor_bytes(model) > TWO_GB - TWO_GB // 32
    base = os.path.basename(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        if use_external:
            location = base + ".data"
            tmpdir = tempfile.mkdtemp(prefix=f".{base}.", dir=folder)
            try:
                tmp_model = os.path.join(tmpdir, base)
                onnx.save_model(model_to_proto(model), tmp_model, save_as_external_data=True, all_tensors_to_one_file=True,
                                location=location, size_threshold=1024)
                data_src = os.path.join(tmpdir, location)
                if os.path.exists(data_src):
                    os.replace(data_src, os.path.join(folder, location))
                os.replace(tmp_model, path)
            finally:
                for f in os.listdir(tmpdir):
                    os.unlink(os.path.join(tmpdir, f))
                os.rmdir(tmpdir)
        else:
            # NOTE: a 1 MB buffer: with the default 8 KB one, the ~240k pieces of a 90k-node model (most nodes and
            # many tensors under 8 KB) went out in ~24k write calls (now ~190), about 0.1 s of bench_ir's Q
            with open(tmp, "wb", buffering=_WRITE_BUFFER) as f:
                f.writelines(model_to_byte_pieces(model))
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str, data: "bytes | str", protect: tuple = ()) -> None:
    """Write a small output file (JSON, report) atomically, never over an input file."""
    folder = _output_folder(path, protect, "an input file")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


__all__ = ["load_model", "load_proto", "save_model", "write_atomic", "model_from_proto", "model_to_proto",
           "InvalidModelError"]
