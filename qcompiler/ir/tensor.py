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

from qcompiler.errors import ModelLoadError
from qcompiler.input_files import open_regular


class ExternalRef:
    """Where an external tensor's bytes live: a checked path inside the model folder, an offset and a length.

    `location` is the entry as the file wrote it (for messages); `path` is its resolved real path.
    """

    __slots__ = ("path", "offset", "length", "location")

    def __init__(self, path: str, offset: int, length: int, location: str = ""):
        self.path, self.offset, self.length, self.location = path, offset, length, location


def read_external_bytes(ref: ExternalRef, name: str) -> bytes:
    """The `ref.length` bytes at `ref.offset` of a checked external-data file (see onnx_io.tensor_check).

    Opened again as a regular file (`input_files.open_regular`), so a file replaced by a FIFO or a device since
    the model was loaded is refused, and a file that shrank is named rather than decoded short.
    """
    what = f"tensor '{name[:80]}': external data file '{(ref.location or ref.path)[:80]}'"
    with open_regular(ref.path, "tensor data", ModelLoadError, limit=None) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if ref.offset + ref.length > size:
                raise ModelLoadError(f"{what} is now {size} bytes, too short for the range "
                                     f"[{ref.offset}, {ref.offset + ref.length}) checked at load")
            f.seek(ref.offset)
            raw = f.read(ref.length)
        except OSError as e:
            raise ModelLoadError(f"{what}: cannot read ({e.strerror or e})") from None
    if len(raw) != ref.length:
        raise ModelLoadError(f"{what}: read {len(raw)} of {ref.length} bytes (file changed since load)")
    return raw


def _plain_dtype(data_type: int):
    """The little-endian numpy dtype of a plain numeric ONNX type (float, int, bool), else None."""
    try:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))
    except Exception:
        return None
    return dt.newbyteorder("<") if dt.kind in "biuf" and dt.itemsize in (1, 2, 4, 8) else None


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
    def _imported(cls, proto: onnx.TensorProto, dtype: int, dims: tuple,
                  external: Optional[ExternalRef] = None) -> "Tensor":
        """A Tensor for a checked proto whose dtype and dims the caller has already read (the importer:
        each field read on a upb message costs about a microsecond)."""
        t = cls.__new__(cls)
        t._proto, t._external, t._array, t.dtype, t.dims = proto, external, None, dtype, dims
        return t

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

    def numpy_uncached(self) -> np.ndarray:
        """The values without keeping them: an external tensor not yet decoded is read again on the next call.
        Weight-only quantization reads each weight once and replaces it, so a model larger than memory never
        holds all its float weights at once."""
        if self._array is not None:
            return self._array
        if self._external is not None:
            return self._read_external()
        return numpy_helper.to_array(self._proto)

    def _read_external(self) -> np.ndarray:
        raw = read_external_bytes(self._external, self._proto.name)
        dt = _plain_dtype(self.dtype)
        if dt is not None and len(raw) == self.nbytes:
            # NOTE: the bytes as they are (little-endian raw_data): no TensorProto copy and no to_array copy,
            # which for a 2 GB model's weights cost two extra copies of each weight (~10 s)
            return np.frombuffer(raw, dtype=dt).reshape(self.dims)
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
