"""Calibration and verification data: samples from .npz/.npy files, folders of them, iterables or readers.

Sources: an `.npz` (one key per graph input), an `.npy` (a single-input model: the one array is that input), a
folder of them (sorted by name), any iterable of `{input name: array}` feed dicts, or any object with a
`get_next()` method returning a feed dict or None at the end (onnxruntime's `CalibrationDataReader`, and the
readers of Intel Neural Compressor and NVIDIA ModelOpt have that shape). A user's object is never asked for its
`len()` (onnxruntime's reader raises on it); a list or tuple is. An iterator or reader is read ONCE: iterating
the SampleSet again rewinds a reader with a `rewind()` method and otherwise raises a DataError (quantize()
reads the samples once and keeps what its report needs, see calibrate.py).

THE RULE (how arrays map to samples), for a graph input of rank r:
  - array rank r+1: axis 0 indexes samples; sample i is `a[i]`, already shaped for the model. The corpus
    files store `(N, 1, ...)`, i.e. N samples that each carry their own batch dim of 1.
  - array rank r: axis 0 is both the sample axis and the batch axis; sample i is `a[i:i+1]` (batch 1).
    This only fits a model whose batch dim is dynamic or 1; for a static batch k > 1 add a leading sample axis.
  - array rank r-1 (r >= 2): ONE sample saved without its batch dim (`np.save("img_017.npy", chw)` for each
    image of a folder); the batch dim of 1 is added, with a note. Only for a dynamic or 1 batch dim.
  - input of unknown rank: axis 0 indexes samples.
An iterable of dicts (API) is different: each dict is ONE feed. Its arrays have rank r (used as is) or rank
r+1 with a leading 1 (dropped).

Checks, each a one-line DataError naming file, input and sample: missing input, unknown key (the key
`labels` is ignored), wrong dtype (int32 -> int64 and float64 -> float32 are converted, with a note in
`notes`), wrong rank, wrong static dim, NaN/Inf, empty set, keys with different sample counts, object arrays,
corrupted or truncated files. Shapes and dtypes come from the .npy headers (checked before any data is read),
so a folder's length is known without reading its data. Nothing is ever unpickled.

Reading is bounded: every file (the .npz, each member of a folder) is opened through input_files.open_regular,
so a FIFO, a device or a folder named `x.npz` is one line, not a hang. Arrays are read SAMPLE BY SAMPLE: a
sample of a C-ordered .npy member is one contiguous run of bytes, so each member is streamed (a stored member
is read in place, a deflated one decompressed as it goes) and only the bytes of the samples used are read:
`--limit 2` on a member that inflates to 1.6 GB reads two samples' worth. A member's declared size must hold
what its header claims; a single sample larger than MAX_SAMPLE_BYTES is refused; a Fortran-ordered member
(rare: np.save of a transposed array) is read whole only up to MAX_FORTRAN_BYTES. A plain .npy is read the same
way from the open file (header checked against the file's size, then sample by sample): never np.load, so
never a pickle and never the whole array at once.
"""
from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Optional

import numpy as np
import onnx

from qcompiler.errors import DataError
from qcompiler.input_files import check_path_text, open_regular
from qcompiler.shorten import short_text, short_value

IGNORED_KEYS = ("labels",)
POSITIONAL_KEY = "arr_0"           # np.savez(f, x): an unnamed array
KIND = "calibration data"           # input_files.MAX_BYTES kind of every file read here
MAX_SAMPLE_BYTES = 2 << 30          # one sample of one input
MAX_FORTRAN_BYTES = 256 << 20       # a Fortran-ordered member is read whole, so only a small one
# NOTE: the only conversions we make silently-with-a-note; anything else would hide a preprocessing bug.
# float32/float64 data for a float16 input: an fp16 export of a float32 model, calibrated with the same data
SAFE_CASTS = {(np.dtype(np.int32), np.dtype(np.int64)), (np.dtype(np.float64), np.dtype(np.float32)),
              (np.dtype(np.float32), np.dtype(np.float16)), (np.dtype(np.float64), np.dtype(np.float16))}


def input_specs(graph) -> dict:
    """`{name: (np dtype, shape)}` for the graph inputs that need data (inputs with an initializer are optional)."""
    specs = {}
    for v in graph.inputs:
        if v.is_initializer:
            continue
        dt = v.dtype
        np_dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dt)) if dt else None
        specs[v.name] = (np_dt, v.shape)
    return specs


def _static(dim) -> Optional[int]:
    """The dim's size if it is a fixed positive int, else None (str, None, 0 or -1 mean dynamic)."""
    return dim if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim > 0 else None


@dataclass
class _KeyInfo:
    dtype: np.dtype
    shape: tuple


class SampleSet:
    """Validated samples: iterate for `{input name: array}` feeds; `len()` works when the count is known.

    `notes` lists the conversions made (e.g. float64 -> float32). Iterating again re-reads the files (an API
    iterator can only be iterated once).
    """

    def __init__(self, source, inputs: Mapping[str, tuple], limit: Optional[int] = None, what: str = KIND):
        self.inputs = {k: (np.dtype(dt) if dt is not None else None, tuple(sh) if sh is not None else None)
                       for k, (dt, sh) in inputs.items()}
        self.limit = limit
        self.what = what
        self.notes: list[str] = []
        self._files: Optional[list[tuple[str, int]]] = None  # (path, sample count)
        self._iterable = None
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise DataError(f"sample limit must be an integer, got {type(limit).__name__}")
        if limit is not None and limit < 0:
            raise DataError(f"sample limit must be >= 0, got {limit}")
        self._passes = 0
        self._aliases: dict = {}   # file -> {input name: key in that file} (_match_keys)
        if isinstance(source, (str, os.PathLike, bytes)):
            path = check_path_text(source, what, DataError)
            if os.path.isdir(path):
                try:
                    names = sorted(n for n in os.listdir(path) if n.endswith((".npz", ".npy")))
                except OSError as e:
                    raise DataError(f"{path}: cannot list {what} folder ({e.strerror or e})") from None
                if not names:
                    raise DataError(f"{path}: folder holds no .npz files (nor .npy files, for a single-input model)")
                files = [os.path.join(path, n) for n in names]
                if len(self.inputs) > 1 and all(_is_npy(n) for n in names):
                    files = [path]   # one .npy per input (a multi-input model): the folder is one archive
            elif os.path.lexists(path):
                files = [path]     # open_regular refuses a FIFO, a device, a socket with one line
            else:
                raise DataError(f"{path}: no such file or folder")
            self._files = [(f, self._check_header(f)) for f in files]
            if sum(n for _, n in self._files) == 0:
                raise DataError(f"{path}: empty sample set (0 samples)")
        elif isinstance(source, np.ndarray):
            name = next(iter(self.inputs), "x")
            accepts = (f"a list of feed dicts ([{{'{short_text(name)}': a}}]) or a file (np.save('calib.npy', a))"
                       if len(self.inputs) == 1 else
                       f"a list of feed dicts with one array per input ({_names(self.inputs)}) or an .npz "
                       f"(np.savez(f, {short_text(name)}=...))")
            raise DataError(f"samples: a bare numpy array {_shape(source.shape)}; the model takes {accepts}")
        elif isinstance(source, Mapping):
            raise DataError("sample source is one dict; pass a list of feed dicts, an .npz path or a folder")
        elif callable(getattr(source, "get_next", None)):
            # NOTE: before Iterable: onnxruntime's CalibrationDataReader is iterable too, but its __len__ raises
            self._iterable = _Reader(source)
        elif isinstance(source, Iterable):
            self._iterable = source
        else:
            raise DataError(f"unsupported sample source of type {type(source).__name__} (expected an .npz/.npy "
                            f"path, a folder, an iterable of feed dicts or an object with get_next())")

    # --- size ---------------------------------------------------------------------------------------------
    @property
    def length(self) -> Optional[int]:
        if self._files is not None:
            n = sum(c for _, c in self._files)
        elif isinstance(self._iterable, (list, tuple)):
            n = len(self._iterable)   # never len() of a user's own class: onnxruntime's reader raises
        else:
            return None
        return n if self.limit is None else min(n, self.limit)

    def __len__(self) -> int:
        n = self.length
        if n is None:
            raise TypeError("the number of samples of this iterable source is not known")
        return n

    @property
    def can_read_again(self) -> bool:
        """Can a later pass iterate the samples once more (files, a list, a reader with rewind(), an iterable
        that is not its own iterator), or was the one pass calibration's?"""
        if self._files is not None or isinstance(self._iterable, (list, tuple)) or self._passes == 0:
            return True
        if isinstance(self._iterable, _Reader):
            return self._iterable.can_rewind
        return iter(self._iterable) is not self._iterable

    # --- iteration ----------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        count = 0
        if self.limit == 0:
            return
        self._passes += 1
        if self._passes > 1 and self._files is None and not isinstance(self._iterable, (list, tuple)):
            if isinstance(self._iterable, _Reader) and self._iterable.can_rewind:
                self._iterable.rewind()
            elif isinstance(self._iterable, _Reader) or iter(self._iterable) is self._iterable:
                raise DataError("samples: the reader or iterator was already read once and has no rewind(); "
                                "pass a list, a file or a reader with rewind()")
        source_iter = self._iter_files() if self._files is not None else self._iter_dicts()
        for feed in source_iter:
            yield feed
            count += 1
            if self.limit is not None and count >= self.limit:
                return
        if count == 0 and isinstance(self._iterable, _Reader):
            raise DataError("empty sample set (0 samples): the reader's get_next() returned None at once (a "
                            "reader already read to its end? call its rewind() first, or make a new one)")
        if count == 0 and self._iterable is not None and iter(self._iterable) is self._iterable:
            raise DataError("empty sample set (0 samples): the iterator gave none (a generator is read once: "
                            "pass a new one, or a list)")
        if count == 0:
            raise DataError("empty sample set (0 samples)")

    def _iter_files(self) -> Iterator[dict]:
        for path, n in self._files:
            opener = _NpyFolderSamples if os.path.isdir(path) else _NpySamples if _is_npy(path) else _NpzSamples
            alias = self._aliases.get(path, {})
            inputs = {alias.get(k, k): spec for k, spec in self.inputs.items()}
            with opener(path, inputs, self.what) as reader:
                for i in range(n):
                    feed = {k: self._convert(path, k, reader.sample(alias.get(k, k), i)) for k in self.inputs}
                    self._check_finite(path, feed, i)
                    yield feed

    def _iter_dicts(self) -> Iterator[dict]:
        for i, sample in enumerate(_users(self._iterable)):
            where = "samples"
            if not isinstance(sample, Mapping):
                raise DataError(f"{where}: sample {i}: expected a dict of input arrays, got {type(sample).__name__}")
            self._check_keys(where, list(sample.keys()), f" sample {i}")
            feed = {}
            for name, (dt, shape) in self.inputs.items():
                a = np.asarray(sample[name])
                if a.dtype == object:
                    raise DataError(f"{where}: input '{name}' sample {i}: object arrays are not accepted")
                a = self._convert(where, name, a)
                r = len(shape) if shape is not None else a.ndim
                if a.ndim == r + 1 and a.shape[0] == 1:
                    a = a[0, ...]   # NOTE: not a[0]: for a rank-0 input that is a numpy scalar, which
                    #                onnxruntime refuses ("Unable to handle object of type numpy.int64")
                elif a.ndim != r:
                    raise DataError(f"{where}: input '{name}' sample {i}: rank {a.ndim}, the model expects rank "
                                    f"{r} (one feed per dict; shape {_fmt(shape)})")
                self._check_dims(where, name, a.shape, shape, f" sample {i}")
                feed[name] = a
            self._check_finite(where, feed, i)
            yield feed

    # --- checks -------------------------------------------------------------------------------------------
    def _check_keys(self, where: str, keys: list, sample: str = "", held: Optional[list] = None) -> None:
        """Every model input among `keys`, and no other key; `held`: the keys as the file spells them (named in
        the missing-input line)."""
        missing = [k for k in self.inputs if k not in keys]
        if missing:
            raise DataError(f"{where}:{sample} missing input {_key(missing[0])} (model inputs: "
                            f"{_names(self.inputs)}; {_held(keys if held is None else held, missing[0])})")
        extra = [k for k in keys if k not in self.inputs and k not in IGNORED_KEYS]
        if extra:
            raise DataError(f"{where}:{sample} unknown key '{extra[0]}' (model inputs: {', '.join(self.inputs)})")

    def _check_header(self, path: str) -> int:
        """Validate one file from its .npy headers (no array data read); returns its sample count."""
        if os.path.isdir(path):
            infos = {n[:-4]: _npy_header(os.path.join(path, n), self.what)
                     for n in sorted(os.listdir(path)) if _is_npy(n)}
        elif _is_npy(path):
            if len(self.inputs) != 1:
                raise DataError(f"{path}: an .npy file holds one array, but the model has {len(self.inputs)} "
                                f"inputs ({', '.join(list(self.inputs)[:5])}); use an .npz with one key per input")
            infos = {next(iter(self.inputs)): _npy_header(path, self.what)}
        else:
            infos = _npz_headers(path, self.what, wanted=self.inputs)
        alias = self._match_keys(path, list(infos))
        if any(infos[key] is None for key in alias.values()):   # a key spelled otherwise: its header now
            infos = _npz_headers(path, self.what, wanted=set(alias.values()))
        infos = {name: infos[key] for name, key in alias.items()}
        self._aliases[path] = alias
        counts = {}
        for name, (dt, shape) in self.inputs.items():
            info = infos[name]
            if info.dtype.hasobject:
                raise DataError(f"{path}: input '{name}': object arrays are not accepted")
            if dt is not None and info.dtype != dt and (info.dtype, dt) not in SAFE_CASTS:
                raise DataError(f"{path}: input '{name}': dtype {info.dtype}, the model expects {dt}")
            if shape is None:
                if len(info.shape) == 0:
                    raise DataError(f"{path}: input '{name}': a scalar array has no sample axis")
                counts[name] = info.shape[0]
                continue
            r = len(shape)
            if len(info.shape) == r + 1:
                counts[name] = info.shape[0]
                self._check_dims(path, name, info.shape[1:], shape)
            elif len(info.shape) == r and r > 0:
                counts[name] = info.shape[0]
                if _static(shape[0]) not in (None, 1):
                    raise DataError(f"{path}: input '{name}': rank-{r} array means batch-1 samples along axis 0, "
                                    f"but the model's batch dim is {shape[0]}; add a leading sample axis")
                self._check_dims(path, name, (1,) + tuple(info.shape[1:]), shape)
            elif len(info.shape) == r - 1 and r >= 2 and _static(shape[0]) in (None, 1):
                counts[name] = 1   # one sample saved without its batch dim (a folder of per-sample files)
                self._check_dims(path, name, (1,) + tuple(info.shape), shape)
                note = f"input '{name}': a rank-{r - 1} array is one sample (batch dim of 1 added)"
                if note not in self.notes:
                    self.notes.append(note)
            else:
                raise DataError(f"{path}: input '{name}': rank {len(info.shape)} array {tuple(info.shape)}, "
                                f"expected rank {r + 1} (samples, {_fmt(shape)[1:-1]}) or rank {r}")
        if len(set(counts.values())) > 1:
            desc = ", ".join(f"'{k}': {v}" for k, v in counts.items())
            raise DataError(f"{path}: keys hold different sample counts ({desc})")
        n = next(iter(counts.values()), 0)
        return n

    def _match_keys(self, path: str, keys: list) -> dict:
        """`{input name: key in the file}`. A key spelled differently from its input still matches when the match
        is unique: the same name up to tf2onnx's `:0` suffix and punctuation (`input_1` for `input_1:0`,
        `past_key_values_0_key` for `past_key_values.0.key`), or, for a single-input model, a file whose one
        array has no name (`np.savez(f, x)` writes `arr_0`): the same information as an .npy. Each such match
        is a note; anything else (another name) is the missing-input / unknown-key line."""
        keys = [k for k in keys if k not in IGNORED_KEYS]
        alias = {name: name for name in self.inputs if name in keys}
        rest = [k for k in keys if k not in alias.values()]
        missing = [name for name in self.inputs if name not in alias]
        if missing and rest:
            spellings = {name: _spellings(name) for name in self.inputs}
            for name in missing:
                cand = [k for k in rest if _norm(k) in spellings[name]]
                rivals = [n for n in self.inputs if cand and _norm(cand[0]) in spellings[n]]
                if len(cand) == 1 and rivals == [name]:
                    alias[name] = cand[0]
            if len(self.inputs) == 1 and not alias and rest == [POSITIONAL_KEY]:
                alias[missing[0]] = POSITIONAL_KEY
        for name, key in alias.items():
            if key != name:
                note = f"{path}: key {_key(key)} read as input {_key(name)}"
                if note not in self.notes:
                    self.notes.append(note)
        self._check_keys(path, list(alias) + [k for k in keys if k not in alias.values()], held=keys)
        return alias

    def _check_dims(self, where: str, name: str, got: tuple, shape: tuple, sample: str = "") -> None:
        for d, (g, want) in enumerate(zip(got, shape)):
            s = _static(want)
            if s is not None and g != s:
                raise DataError(f"{where}: input '{name}'{sample}: dim {d} is {g}, the model expects {s} "
                                f"(sample shape {tuple(got)}, model shape {_fmt(shape)})")

    def _convert(self, where: str, name: str, a: np.ndarray) -> np.ndarray:
        dt = self.inputs[name][0]
        if dt is None or a.dtype == dt:
            return a
        if (a.dtype, dt) in SAFE_CASTS:
            note = f"{where}: input '{name}': converted {a.dtype} to {dt}"
            if note not in self.notes:
                self.notes.append(note)
            if a.dtype == np.int32 or not np.any(np.abs(a[np.isfinite(a)]) > np.finfo(dt).max):
                return a.astype(dt)
            raise DataError(f"{where}: input '{name}': {a.dtype} values overflow {dt}")
        raise DataError(f"{where}: input '{name}': dtype {a.dtype}, the model expects {dt}")

    @staticmethod
    def _check_finite(where: str, feed: dict, i: int) -> None:
        for name, a in feed.items():
            if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
                what = "NaN" if np.any(np.isnan(a)) else "Inf"
                raise DataError(f"{where}: input '{name}' sample {i}: contains {what}")


class _Reader:
    """A `get_next()` reader as an iterable: feeds until it returns None (its `len()` is never asked)."""

    def __init__(self, reader):
        self.reader = reader
        self.can_rewind = callable(getattr(reader, "rewind", None))

    def rewind(self) -> None:
        self.reader.rewind()

    def __iter__(self) -> Iterator:
        while True:
            feed = self.reader.get_next()
            if feed is None:
                return
            yield feed


def _users(iterable) -> Iterator:
    """The items of a caller's iterable or reader; an exception it raises becomes a DataError naming it first
    (its type and message, the sample it stopped at), with the caller's exception as the cause."""
    it, i = None, 0
    while True:
        try:
            it = iter(iterable) if it is None else it
            item = next(it)
        except StopIteration:
            return
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 - the caller's own code: its error, named, is the message
            where = "its get_next()" if isinstance(iterable, _Reader) else "the iterable"
            raise DataError(f"{type(e).__name__}: {short_text(str(e), 160)} (raised by the calibration data: "
                            f"{where} failed at sample {i})") from e
        yield item
        i += 1


def _is_npy(path: str) -> bool:
    return path.lower().endswith(".npy")


def load_samples(source, inputs: Mapping[str, tuple], limit: Optional[int] = None, what: str = KIND) -> SampleSet:
    """Samples from an .npz or .npy path, a folder of them (sorted by name), an iterable of feed dicts or an
    object with `get_next()` (onnxruntime's CalibrationDataReader).

    `inputs` maps each graph input to `(numpy dtype, shape)` with dims as int, str or None (see `input_specs`).
    See the module docstring for THE RULE mapping array axes to samples and the checks made.
    """
    return SampleSet(source, inputs, limit, what)


def _read_npy_header(f, path: str, key: str):
    """(shape, fortran_order, dtype) from an open .npy stream positioned at its start."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise DataError(f"{path}: key {_key(key)}: unsupported .npy version {version}")
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


# an .npz member that inflates more than this many times over, past this size, is refused: calibration arrays
# compress a few times over (savez_compressed), a 1 MB file that inflates to 4M samples is a bomb
MAX_INFLATE_RATIO = 500
MAX_INFLATE_BYTES = 64 << 20


def _npz_headers(path: str, what: str = KIND, wanted: "Optional[Mapping]" = None) -> dict:
    """`{key: _KeyInfo}` read from the .npy headers inside an .npz, without reading array data.

    With `wanted` (the model's inputs), only those members' headers are read; any other key maps to None (the
    caller names an unknown key from the archive's directory alone: 30000 extra members cost 8.6 s of header
    reads before the first was named)."""
    out = {}
    try:
        with open_regular(path, what, DataError) as fh, zipfile.ZipFile(fh) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise DataError(f"{path}: member {_key(info.filename)} is not an .npy array")
                key = info.filename[:-4]
                if info.file_size > max(MAX_INFLATE_BYTES, MAX_INFLATE_RATIO * max(info.compress_size, 1)):
                    raise DataError(f"{path}: member {_key(info.filename)} inflates {info.compress_size} bytes to "
                                    f"{info.file_size} (over {MAX_INFLATE_RATIO}x: a zip bomb, not sample data)")
                if wanted is not None and key not in wanted:
                    out[key] = None
                    continue
                with zf.open(info) as f:
                    shape, _, dtype = _read_npy_header(f, path, key)
                    header_end = f.tell()
                # NOTE: the header's shape decides how much numpy allocates; a hostile file can claim 10^12
                # elements in a few bytes. The data stored in the archive must be as large as the shape says.
                need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
                if any(d < 0 for d in shape) or need > info.file_size - header_end:
                    raise DataError(f"{path}: key {_key(key)}: header claims shape {_shape(shape)} ({need} bytes) "
                                    f"but the archive holds {max(info.file_size - header_end, 0)} bytes of data")
                out[key] = _KeyInfo(dtype, shape)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - BadZipFile, truncated header, bad dtype descr, ...
        ext = os.path.splitext(path)[1].lower()
        if ext != ".npz":
            raise DataError(f"{path}: not an .npz file; calibration data is an .npz (one array per input, "
                            f"np.savez(f, x=...)), an .npy (a single-input model) or a folder of them"
                            f"{f', not a {short_text(ext, 12)} file' if ext else ''}") from None
        raise DataError(f"{path}: not a readable .npz file ({_short(e)})") from None
    if not out:
        raise DataError(f"{path}: .npz file holds no arrays")
    return out


def _npy_header(path: str, what: str = KIND) -> _KeyInfo:
    """The header of a plain .npy file, checked against the file's size (no array data read)."""
    try:
        with open_regular(path, what, DataError) as f:
            shape, _, dtype = _read_npy_header(f, path, "array")
            header_end = f.tell()
            f.seek(0, 2)
            size = f.tell()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated header, bad dtype descr, ...
        raise DataError(f"{path}: not a readable .npy file ({_short(e)})") from None
    need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if any(d < 0 for d in shape) or need > size - header_end:
        raise DataError(f"{path}: header claims shape {_shape(shape)} ({need} bytes) but the file holds "
                        f"{max(size - header_end, 0)} bytes of data")
    return _KeyInfo(dtype, shape)


class _NpzSamples:
    """Sample-by-sample reader of the members of one .npz (see the module docstring).

    Each member needed is opened once as a stream positioned after its .npy header; `sample(key, i)` reads
    sample i's bytes (i must not go backwards: samples are read in order) and skips any before it. A stored
    member's stream seeks in place; a deflated one decompresses only up to the bytes wanted.
    """

    def __init__(self, path: str, inputs: Mapping[str, tuple], what: str):
        self.path, self.inputs = path, inputs
        self.fh = open_regular(path, what, DataError)
        self.streams = {}
        try:
            self.zf = zipfile.ZipFile(self.fh)
        except Exception as e:  # noqa: BLE001
            self.fh.close()
            raise DataError(f"{path}: not a readable .npz file ({_short(e)})") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for st in self.streams.values():
            try:
                st["f"].close()
            except Exception:  # noqa: BLE001 - closing a broken stream must not hide the first error
                pass
        self.zf.close()
        self.fh.close()

    def _open(self, key: str) -> dict:
        path = self.path
        try:
            f = self._member(key)
            shape, fortran, dtype = _read_npy_header(f, path, key)
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{path}: input {_key(key)}: cannot read array ({_short(e)})") from None
        if dtype.hasobject:
            raise DataError(f"{path}: input {_key(key)}: object arrays are not accepted")
        want = self.inputs.get(key, (None, None))[1]
        if want is not None and len(shape) == len(want) - 1:
            shape = (1,) + tuple(shape)   # one sample without its batch dim (_check_header): a leading 1
        per = shape[1:] if (want is None or len(shape) == len(want) + 1) else (1,) + shape[1:]
        nbytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        st = {"f": f, "dtype": dtype, "per": per, "nbytes": nbytes, "next": 0, "whole": None}
        if nbytes > MAX_SAMPLE_BYTES:
            raise DataError(f"{path}: input {_key(key)}: one sample is {nbytes} bytes, over the "
                            f"{MAX_SAMPLE_BYTES}-byte limit")
        if fortran and len(shape) > 1:
            total = nbytes * shape[0]
            if total > MAX_FORTRAN_BYTES:
                raise DataError(f"{path}: input {_key(key)}: stored in Fortran order ({total} bytes), which cannot "
                                f"be read sample by sample; save it C-ordered (np.ascontiguousarray)")
            raw = self._read(st, key, total)
            st["whole"] = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F")
        self.streams[key] = st
        return st

    def _member(self, key: str):
        return self.zf.open(key + ".npy")

    def _read(self, st: dict, key: str, n: int) -> bytes:
        try:
            buf = st["f"].read(n)
        except Exception as e:  # noqa: BLE001 - zlib.error, BadZipFile (CRC), OSError
            raise DataError(f"{self.path}: input {_key(key)}: cannot read array ({_short(e)})") from None
        if len(buf) != n:
            raise DataError(f"{self.path}: input {_key(key)}: array data is truncated")
        return buf

    def sample(self, key: str, i: int) -> np.ndarray:
        st = self.streams.get(key) or self._open(key)
        if st["whole"] is not None:
            a = st["whole"][i] if len(st["per"]) == st["whole"].ndim - 1 else st["whole"][i:i + 1]
            return np.ascontiguousarray(a)
        skip = (i - st["next"]) * st["nbytes"]
        if skip < 0:
            raise DataError(f"{self.path}: input {_key(key)}: samples must be read in order")
        if skip:
            try:
                st["f"].seek(skip, 1)   # stored: a seek; deflated: decompress and discard
            except Exception as e:  # noqa: BLE001
                raise DataError(f"{self.path}: input {_key(key)}: cannot read array ({_short(e)})") from None
        raw = self._read(st, key, st["nbytes"])
        st["next"] = i + 1
        return np.frombuffer(bytearray(raw), dtype=st["dtype"]).reshape(st["per"])


class _NpySamples(_NpzSamples):
    """The same sample-by-sample reader over a plain .npy file (a single-input model: its one key)."""

    def __init__(self, path: str, inputs: Mapping[str, tuple], what: str):
        self.path, self.inputs = path, inputs
        self.fh = open_regular(path, what, DataError)
        self.streams = {}
        self.zf = self.fh      # closed by __exit__ like an archive

    def __exit__(self, *exc):
        self.fh.close()

    def _member(self, key: str):
        self.fh.seek(0)
        return self.fh


class _NpyFolderSamples(_NpzSamples):
    """A folder holding one .npy per input (`input_ids.npy`, `attention_mask.npy`) read like an .npz's members."""

    def __init__(self, path: str, inputs: Mapping[str, tuple], what: str):
        self.path, self.inputs, self.what = path, inputs, what
        self.streams = {}

    def __exit__(self, *exc):
        for st in self.streams.values():
            st["f"].close()

    def _member(self, key: str):
        return open_regular(os.path.join(self.path, key + ".npy"), self.what, DataError)


def _norm(name: str) -> str:
    """A name with each run of punctuation as one `_` (`past_key_values.0.key` -> `past_key_values_0_key`)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")


def _spellings(name: str) -> set:
    """How a data file may spell input `name`: normalized, with or without tf2onnx's `:0` output suffix
    (`input/x:0` -> `input_x_0`, `input_x`)."""
    return {_norm(name), _norm(name[:-2]) if name.endswith(":0") else _norm(name)}


_key = short_value   # an input name from the data file, quoted (qcompiler/shorten.py)


def _names(names, limit: int = 8) -> str:
    """Input names or file keys for a message: at most `limit`, each cut short."""
    names = list(names)
    text = ", ".join(short_text(n, 40) for n in names[:limit])
    return text + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _held(keys, wanted: str) -> str:
    """What a data file holds, for the missing-input line; unnamed members (`np.savez(f, a)` writes `arr_0`)
    get the way to name them."""
    keys = [k for k in keys if k not in IGNORED_KEYS]
    if not keys:
        return "the data holds no array"
    text = f"the data holds {_names(keys)}"
    if any(isinstance(k, str) and re.fullmatch(r"arr_\d+", k) for k in keys):
        text += f"; unnamed arrays: save each under its input name, np.savez(f, {short_text(wanted, 40)}=...)"
    return text


def _shape(shape) -> str:
    return str(tuple(shape)) if len(shape) <= 8 else f"({', '.join(map(str, shape[:8]))}, ...) of rank {len(shape)}"


def _short(e: Exception) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}"[:200]


def _fmt(shape) -> str:
    return "(" + ", ".join("?" if _static(d) is None else str(d) for d in shape) + ")" if shape is not None else "?"


__all__ = ["load_samples", "input_specs", "SampleSet"]
