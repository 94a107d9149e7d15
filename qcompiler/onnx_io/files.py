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
from ..ir.tensor import _itemsize
from .exporter import model_to_byte_pieces, model_to_proto
from .importer import model_from_proto

TWO_GB = 2 ** 31 - 1
_WRITE_BUFFER = 1 << 20


def load_proto(path: str) -> onnx.ModelProto:
    """Parse an ONNX file without loading external data; raise ModelLoadError with a one-line reason."""
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a folder, not an ONNX file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    if not data:
        raise ModelLoadError(f"{path}: empty file, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{path}: not an ONNX model or truncated (protobuf parse failed: {str(e).splitlines()[0] if str(e) else 'decode error'})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelLoadError(f"{path}: not an ONNX model (no IR version or no graph)")
    return proto


def load_model(path: str) -> Model:
    """Load an ONNX file into the IR (external data resolved lazily against the file's folder)."""
    from ..arguments import require_path
    path = require_path(path, "model")   # an int would be opened as the caller's file descriptor, then closed
    proto = load_proto(path)
    return model_from_proto(proto, os.path.dirname(os.path.abspath(path)))


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
    from ..arguments import require_model
    require_model(model, "save_model: model")   # 'str' or a ModelProto: one ArgumentError line, not AttributeError
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
