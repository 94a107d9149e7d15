"""Constant tensor payloads: decoded lazily, external data read only from inside the model's folder.

A `Tensor` keeps the original `TensorProto` (or an external-data reference) until someone asks for its values,
so importing and re-exporting a model never decodes weights it does not touch.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelLoadError


class ExternalRef:
    """Where an external tensor's bytes live: a checked path inside the model folder, an offset and a length."""

    __slots__ = ("path", "offset", "length")

    def __init__(self, path: str, offset: int, length: int):
        self.path, self.offset, self.length = path, offset, length


def resolve_external(proto: onnx.TensorProto, base_dir: str) -> ExternalRef:
    """Validate a tensor's external-data entry; refuse any location outside `base_dir` or past the file's end."""
    info = {e.key: e.value for e in proto.external_data}
    loc = info.get("location", "")
    if not loc:
        raise ModelLoadError(f"tensor '{proto.name}': external data has no location")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")):
        raise ModelLoadError(f"tensor '{proto.name}': external data location '{loc}' is absolute; refused")
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, loc))
    if os.path.commonpath([base, path]) != base:
        raise ModelLoadError(f"tensor '{proto.name}': external data location '{loc}' points outside the model's folder; refused")
    if not os.path.isfile(path):
        raise ModelLoadError(f"tensor '{proto.name}': external data file '{loc}' not found")
    try:
        offset = int(info.get("offset", "0") or 0)
        size = os.path.getsize(path)
        length = int(info["length"]) if info.get("length") else size - offset
    except ValueError:
        raise ModelLoadError(f"tensor '{proto.name}': external data offset/length is not an integer") from None
    n = int(np.prod(proto.dims, dtype=np.int64)) if len(proto.dims) else 1
    if any(d < 0 for d in proto.dims):
        raise ModelLoadError(f"tensor '{proto.name}': negative dimension in {list(proto.dims)}")
    itemsize = _itemsize(proto.data_type)
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelLoadError(f"tensor '{proto.name}': external data range [{offset}, {offset + length}) exceeds '{loc}' ({size} bytes)")
    if itemsize and n * itemsize != length and proto.data_type not in _PACKED:
        raise ModelLoadError(f"tensor '{proto.name}': external data length {length} does not match shape {list(proto.dims)}")
    return ExternalRef(path, offset, length)


_PACKED = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4} | ({getattr(onnx.TensorProto, "FLOAT4E2M1")} if hasattr(onnx.TensorProto, "FLOAT4E2M1") else set())


def _itemsize(data_type: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except Exception:
        return 0


class Tensor:
    """A constant's payload: an ONNX TensorProto, an external reference or a numpy array, decoded on demand."""

    __slots__ = ("_proto", "_array", "_external", "dtype", "dims")

    def __init__(self, proto: Optional[onnx.TensorProto] = None, array: Optional[np.ndarray] = None,
                 external: Optional[ExternalRef] = None):
        self._proto, self._external = proto, external
        self._array = None
        if array is not None:
            array = np.asarray(array)
            self._array = array
            self.dtype = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
            self.dims = tuple(array.shape)
        else:
            self.dtype = proto.data_type
            self.dims = tuple(proto.dims)

    @classmethod
    def from_array(cls, array: np.ndarray) -> "Tensor":
        a = np.asarray(array)
        # NOTE: np.ascontiguousarray turns a 0-d array into shape (1,); scalars must stay scalars (Q/DQ scales)
        return cls(array=a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape))

    @property
    def is_external(self) -> bool:
        return self._external is not None and self._array is None

    @property
    def size(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) if self.dims else 1

    @property
    def nbytes(self) -> int:
        return self.size * (_itemsize(self.dtype) or 1)

    def numpy(self) -> np.ndarray:
        """The values as a read-only numpy array (decoded once, then cached)."""
        if self._array is None:
            if self._external is not None:
                self._array = self._read_external()
            else:
                self._array = numpy_helper.to_array(self._proto)
            self._array.setflags(write=False)
        return self._array

    def _read_external(self) -> np.ndarray:
        ref = self._external
        with open(ref.path, "rb") as f:
            f.seek(ref.offset)
            raw = f.read(ref.length)
        p = onnx.TensorProto()
        p.data_type, p.name = self._proto.data_type, self._proto.name
        p.dims.extend(self._proto.dims)
        p.raw_data = raw
        return numpy_helper.to_array(p)

    def to_proto(self, name: str) -> onnx.TensorProto:
        """A TensorProto named `name` holding the data inline (external data is read in)."""
        if self._proto is not None and self._external is None and self._array is None:
            if self._proto.name == name:
                return self._proto
            p = onnx.TensorProto()
            p.CopyFrom(self._proto)
            p.name = name
            return p
        if self._array is None:
            self.numpy()
        if self._proto is not None and self._array.dtype == object:
            p = onnx.TensorProto()
            p.CopyFrom(self._proto)
            p.name = name
            return p
        p = numpy_helper.from_array(np.asarray(self._array), name)
        if self._proto is not None and p.data_type != self._proto.data_type:
            p = numpy_helper.from_array(np.asarray(self._array).astype(
                onnx.helper.tensor_dtype_to_np_dtype(self._proto.data_type)), name)
        return p
