"""Opening untrusted input files: regular files only, sizes bounded by kind, never a hang on a FIFO.

Every file qcompiler reads (a model, its external data, a config, a profile, an encodings file, calibration
data) is opened here, so `/dev/zero`, a FIFO, a folder or a 10 GB "config" is one line naming the file, not a
hang or an out-of-memory kill. The open is non-blocking and the type check is made on the opened descriptor
(`fstat`), so a file swapped between the check and the read cannot slip through.
"""
from __future__ import annotations

import os
import stat
from typing import BinaryIO, Type

from qcompiler.errors import QCompilerError
from qcompiler.shorten import file_kind, short_path

# One source for how large each kind of input may be (bytes). A model file above protobuf's 2 GB limit cannot
# parse anyway; larger models keep their tensors in external data, which is read tensor by tensor.
MAX_BYTES = {
    "model": 2 ** 31,
    "config": 16 << 20,
    "profile": 16 << 20,
    "encodings file": 512 << 20,
    "calibration data": 64 << 30,
    "verification inputs": 8 << 30,
}


MAX_PATH_CHARS = 4096   # Linux's PATH_MAX; a longer "path" is data passed where a path was meant


def _file_noun(what: str) -> str:
    """'a model file', 'an encodings file': the kinds are named as MAX_BYTES names them, some with 'file'."""
    noun = what if what.endswith("file") else f"{what} file"
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def check_path_text(path, what: str, error: Type[Exception] = QCompilerError) -> str:
    """`path` as a str; a non-path, an empty path or one holding a NUL byte is one line."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        raise error(f"{what} path must be a str or os.PathLike, got {type(path).__name__}")
    if not path:
        raise error(f"{what} path is empty")
    if "\x00" in path:
        raise error(f"{short_path(repr(path))}: {what} path holds a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise error(f"{short_path(path)}: {what} path is {len(path)} characters long, more than any file system "
                    f"allows ({MAX_PATH_CHARS})")
    return path


def open_regular(path, what: str, error: Type[Exception] = QCompilerError,
                 limit: "int | None" = None) -> BinaryIO:
    """Open `path` for binary reading if it is a regular file of at most `limit` bytes (default: by kind)."""
    path = check_path_text(path, what, error)
    limit = MAX_BYTES.get(what) if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not {_file_noun(what)}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: is {file_kind(st.st_mode)}, not {_file_noun(what)}")
        if limit is not None and st.st_size > limit:
            raise error(f"{path}: {what} of {st.st_size} bytes is over the {limit}-byte limit for that kind of file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path, what: str, error: Type[Exception] = QCompilerError, limit: "int | None" = None) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (see `open_regular`).

    Reads at most one byte past the limit, so a file that grows while it is read cannot make it unbounded.
    """
    limit = MAX_BYTES.get(what) if limit is None else limit
    with open_regular(path, what, error, limit) as f:
        try:
            # NOTE: read(n) allocates n bytes up front: ask for what fstat says is there (plus one byte to see a
            # file that grows), never for the kind's limit (2 GB of address space for every model read)
            want = os.fstat(f.fileno()).st_size + 1
            data = f.read(min(want, limit + 1) if limit is not None else want)
            while limit is None or len(data) <= limit:   # the file grew after the fstat
                more = f.read(1 << 20 if limit is None else min(1 << 20, limit + 1 - len(data)))
                if not more:
                    break
                data += more
        except OSError as e:
            raise error(f"{os.fspath(path)}: cannot read {what} ({e.strerror or e})") from None
    if limit is not None and len(data) > limit:
        raise error(f"{os.fspath(path)}: {what} is over the {limit}-byte limit for that kind of file")
    return data


__all__ = ["MAX_BYTES", "MAX_PATH_CHARS", "check_path_text", "open_regular", "read_bounded"]
