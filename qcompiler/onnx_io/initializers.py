"""Reading a few named initializers of an ONNX file without parsing the rest of it.

Why: a pass late in the pipeline may need the float originals of a few weights the quantized model holds only as
integers (the safety net's weight phase). Parsing the whole file again for them held every weight of the model
once more, and its file bytes besides. Here the file's protobuf wire format is walked field by field
(ModelProto.graph = 7 -> GraphProto.initializer = 5 -> TensorProto.name = 8), skipping everything else by its
length; only the tensors asked for are read and parsed, each checked as the importer checks it (its size against
its shape; external data only from inside the model's folder). Main-graph initializers only.
"""
from __future__ import annotations

import os
from typing import BinaryIO, Dict, Iterable, Iterator, Tuple

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from qcompiler.errors import ModelLoadError
from qcompiler.input_files import open_regular
from qcompiler.ir.tensor import Tensor
from qcompiler.onnx_io.tensor_check import check_tensor, short

# the field numbers as onnx's own schema gives them (7, 5 and 8)
_MODEL_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_GRAPH_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_TENSOR_NAME = onnx.TensorProto.DESCRIPTOR.fields_by_name["name"].number
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(f: BinaryIO, pos: int, end: int, path: str) -> Tuple[int, int]:
    """(value, position after it) of the varint at `pos`."""
    f.seek(pos)
    raw = f.read(min(10, end - pos))
    n = shift = 0
    for i, b in enumerate(raw):
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos + i + 1
        shift += 7
    raise ModelLoadError(f"{path}: not an ONNX model or truncated (bad varint at byte {pos})")


def _length_fields(f: BinaryIO, start: int, end: int, path: str) -> Iterator[Tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of the message in bytes [start, end), in file
    order; other fields are skipped."""
    pos = start
    while pos < end:
        key, pos = _varint(f, pos, end, path)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _varint(f, pos, end, path)
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _BYTES:
            n, pos = _varint(f, pos, end, path)
            if pos + n > end:
                break
            yield number, pos, pos + n
            pos += n
        else:
            break
    if pos != end:
        raise ModelLoadError(f"{path}: not an ONNX model or truncated (bad field at byte {pos})")


def _tensor_name(f: BinaryIO, start: int, end: int, path: str):
    """The name of the TensorProto in [start, end) (the last one given, as protobuf reads it), or None."""
    name = None
    for number, a, b in _length_fields(f, start, end, path):
        if number == _TENSOR_NAME:
            f.seek(a)
            name = f.read(b - a)
    try:
        return None if name is None else name.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_initializers(path: str, names: Iterable[str]) -> Dict[str, np.ndarray]:
    """{name: values} for those of `names` that are initializers of the main graph of the ONNX file at `path`.

    A malformed file, a tensor whose data does not fit its shape, or external data outside the model's folder is
    one ModelLoadError line naming the file."""
    wanted = set(names)
    out: Dict[str, np.ndarray] = {}
    if not wanted:
        return out
    base_dir = os.path.dirname(os.path.abspath(path))
    with open_regular(path, "model", ModelLoadError) as f:
        size = os.fstat(f.fileno()).st_size
        for number, a, b in _length_fields(f, 0, size, path):
            if number != _MODEL_GRAPH:
                continue
            for number2, c, d in _length_fields(f, a, b, path):
                if number2 != _GRAPH_INITIALIZER:
                    continue
                name = _tensor_name(f, c, d, path)
                if name not in wanted:
                    continue
                if name in out:
                    raise ModelLoadError(f"{path}: initializer '{short(name)}' is listed twice")
                f.seek(c)
                tp = onnx.TensorProto()
                try:
                    tp.ParseFromString(f.read(d - c))
                except (DecodeError, RuntimeError, ValueError):
                    raise ModelLoadError(f"{path}: initializer '{short(name)}' is not a valid tensor") from None
                out[name] = _values(tp, lambda: f"{path}: initializer '{short(name)}'", base_dir)
    return out


def proto_initializers(proto: onnx.ModelProto, names: Iterable[str]) -> Dict[str, np.ndarray]:
    """`read_initializers` for a ModelProto in memory (no folder: external data is refused)."""
    wanted = set(names)
    return {tp.name: _values(tp, lambda: f"initializer '{short(tp.name)}'", None)
            for tp in proto.graph.initializer if tp.name in wanted}


def _values(tp: onnx.TensorProto, where, base_dir) -> np.ndarray:
    """The values of one initializer, checked as the importer checks it."""
    dt, dims, ref = check_tensor(tp, where, base_dir)
    return Tensor._imported(tp, dt, dims, ref).numpy()


__all__ = ["read_initializers", "proto_initializers"]
