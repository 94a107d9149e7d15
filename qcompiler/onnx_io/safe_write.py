"""Writing outputs safely: never over a file an input reads, never over a device, FIFO or folder, atomically.

- Inputs are compared by identity (device, inode; links resolved), never by spelling, so `..`, a hard link or a
  symlink either way round cannot make an output land on an input. `Protected` holds the input files: paths
  given, every file of a calibration folder, a model's own file and its external-data files.
- `output_target` decides what an output path is: a regular file (or a new one) is replaced atomically; a
  character device (`/dev/null`, a terminal) is written through, never renamed over; anything else (folder,
  FIFO, socket, block device, a path under /proc or /sys, a missing folder, a trailing slash) is one line.
- Atomic writes create their temp file with mode 0o666 so the umask applies (not mkstemp's 0600), fsync it and
  rename it over the final name. The temp file is named `.<base>.qcompiler-<pid>-<owner>-<random>.tmp`, so a
  later run recognises leftovers of a killed run (pid no longer alive, same host and pid namespace) and
  removes them before it writes into that folder. SIGINT and SIGTERM during a write remove the temp files and
  then reach the handler that was there before (so the process still ends with the right status).
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import signal
import socket
import stat
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Optional

from qcompiler.errors import OutputError
from qcompiler.input_files import check_path_text
from qcompiler.shorten import file_kind, short_path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

WRITE_BUFFER = 1 << 20
_NAME_KEEP = 150          # characters of the output's name kept in temp names (NAME_MAX is 255 bytes)
_SPECIAL_ROOTS = ("/proc", "/sys")
_TMP_RE = re.compile(r"^\..*\.qcompiler-(\d+)-([0-9a-f]{6})-[0-9a-f]{8}\.tmp$", re.S)
_LOCK_RE = re.compile(r"^\..*\.qcompiler\.lock$", re.S)
_cleaned: set = set()     # folders this process has already swept for leftovers
# errors of the place written to (full disk, read-only, no permission...): one line, not a traceback
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR,
                 errno.ENAMETOOLONG, errno.ELOOP, errno.EFBIG, errno.EIO, errno.ETXTBSY}


show = short_path   # paths in messages (qcompiler/shorten.py)


def _special(real: str) -> bool:
    return any(real == r or real.startswith(r + "/") for r in _SPECIAL_ROOTS)


def _as_given(path: str) -> str:
    """`path` (absolute) as a user in the working folder would have named it: relative when it is inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:   # another drive
        return path
    return path if rel.startswith("..") else rel


# --- what an input reads ---------------------------------------------------------------------------------------
def model_input_files(model) -> list:
    """The file `model` was loaded from and every external-data file its tensors still read."""
    files = []
    src = getattr(model, "source_path", None)
    if src:
        files.append(src)
    seen = set()
    for path in getattr(model, "external_files", None) or ():   # every file the import read, inlined ones too
        if path not in seen:
            seen.add(path)
            files.append(path)
    for g in model.graphs():
        for v in g.initializers.values():
            ext = getattr(v.tensor, "_external", None)
            if ext is not None and ext.path not in seen:
                seen.add(ext.path)
                files.append(ext.path)
    return files


class Protected:
    """The files some input reads, by identity (st_dev, st_ino) and by resolved path, each with a label."""

    def __init__(self, paths: Iterable = (), models: Iterable = (), external_files_of: Optional[Callable] = None):
        # `external_files_of(path)`: the external-data files of a model given as a path (onnx_io.files reads them)
        self.external_files_of = external_files_of
        self.ids: dict = {}
        self.real: dict = {}
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = (paths,)   # protect="in.onnx" means that file, not its characters
        for p in paths:
            self.add(p)
        for m in models:
            self.add_model(m)

    def add(self, path, note: str = "", members: bool = True) -> None:
        """Protect `path`; a folder protects every file directly in it (a calibration folder's members).
        `note` says in messages why the file is an input (e.g. whose external data it is)."""
        if path is None or path == "":
            return
        try:
            path = os.fspath(path)
            st = os.stat(path)
        except (TypeError, ValueError, OSError):
            return
        label = (path, note)
        if stat.S_ISDIR(st.st_mode):
            if not members:
                return
            try:
                with os.scandir(path) as it:
                    for e in it:
                        self.add(e.path, f" (in the folder '{show(path)}')", members=False)
            except OSError:
                pass
            return
        if not stat.S_ISREG(st.st_mode):
            return   # a device or FIFO given as an input is refused by the reader; nothing to overwrite
        self.ids.setdefault((st.st_dev, st.st_ino), label)
        self.real.setdefault(os.path.realpath(path), label)

    def add_model(self, model) -> None:
        """Protect a model (an IR Model, or a model file path) and its external-data files."""
        if isinstance(model, (str, bytes, os.PathLike)):
            path = os.fspath(model)
            self.add(path, members=False)
            for ext in (self.external_files_of(path) if self.external_files_of else ()):
                self.add(ext, f" (external data of '{show(path)}')", members=False)
            return
        files = model_input_files(model)
        src = getattr(model, "source_path", None)
        note = f" (external data of '{show(_as_given(src))}')" if src else " (external data the model reads)"
        for p in files:
            self.add(p, "" if p == src else note, members=False)

    def find(self, path: str) -> Optional[tuple]:
        """The label of the input file `path` names (by identity, else by resolved spelling), or None."""
        try:
            st = os.stat(path)
            hit = self.ids.get((st.st_dev, st.st_ino))
            if hit is not None:
                return hit
        except (OSError, ValueError):
            pass
        return self.real.get(os.path.realpath(path))

    def refuse(self, path: str, opt: str) -> None:
        hit = self.find(path)
        if hit is not None:
            raise OutputError(f"{show(path)}: {opt} would overwrite the input file '{show(hit[0])}'{hit[1]}; "
                              "choose another path")


# --- what an output is ---------------------------------------------------------------------------------------
class Target:
    """A checked output path: `device` outputs are written through, others replaced atomically in `folder`.

    NOTE: an output that is a symlink to a regular file is replaced by the new file (the link itself, as `mv`
    and `sed -i` do), never written through: the link's target may be anywhere, and the rename is what makes
    the write atomic. A link that points at an input is refused before that (`Protected` compares targets).
    """

    __slots__ = ("path", "folder", "base", "device")

    def __init__(self, path: str, device: bool):
        self.path, self.device = path, device
        self.folder = os.path.dirname(path) or "."
        self.base = os.path.basename(path)


def output_target(path, opt: str = "output", folder_may_be_missing: bool = False) -> Target:
    """Check an output path without writing anything; one line for any path that cannot be written safely.

    `folder_may_be_missing`: the folder is checked separately (`check_output_folder`) and made before writing.
    """
    path = check_path_text(path, opt, OutputError)
    if path.endswith(("/", os.sep)) or os.path.basename(path) in (".", ".."):
        raise OutputError(f"{show(path)}: {opt} names a folder; give a file path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise OutputError(f"{show(path)}: {opt}: a parent of this path is not a folder") from None
    except OSError as e:
        raise OutputError(f"{show(path)}: cannot use as {opt} ({e.strerror or e})") from None
    if st is not None:
        if stat.S_ISCHR(st.st_mode):
            return Target(path, device=True)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{show(path)}: {opt} is {file_kind(st.st_mode)}, not a regular file; refusing to "
                              "replace it")
    if _special(os.path.realpath(path)):
        raise OutputError(f"{show(path)}: {opt} is under /proc or /sys; refusing to write there")
    folder = os.path.dirname(path) or "."
    if not folder_may_be_missing and not os.path.isdir(folder):
        raise OutputError(f"{show(path)}: {opt}: output folder '{show(folder)}' does not exist")
    return Target(path, device=False)


def data_target(path: str, opt: str, folder_may_be_missing: bool = False) -> Target:
    """The `.data` file beside a model output: always renamed into place, so a device there is refused too."""
    t = output_target(path, opt, folder_may_be_missing)
    if t.device:
        raise OutputError(f"{show(path)}: {opt} is a character device, not a regular file; refusing to replace it")
    return t


def check_output_folder(folder, opt: str) -> str:
    """A folder that outputs will be written into (created if missing): refuse a file, /proc, /sys or a path that
    cannot be created, without creating anything."""
    folder = check_path_text(folder, f"{opt} folder", OutputError)
    if _special(os.path.realpath(folder)):
        raise OutputError(f"{show(folder)}: {opt} is under /proc or /sys; refusing to write there")
    probe = folder
    while True:
        try:
            st = os.stat(probe)
        except FileNotFoundError:
            parent = os.path.dirname(probe.rstrip("/")) or "."
            if parent == probe:
                raise OutputError(f"{show(folder)}: {opt} cannot be created") from None
            probe = parent
            continue
        except OSError as e:
            raise OutputError(f"{show(folder)}: {opt} cannot be used ({e.strerror or e})") from None
        if not stat.S_ISDIR(st.st_mode):
            if probe == folder:
                raise OutputError(f"{show(folder)}: {opt} is {file_kind(st.st_mode)}, not a folder")
            raise OutputError(f"{show(folder)}: {opt} cannot be created ('{show(probe)}' is not a folder)")
        if probe != folder and not os.access(probe, os.W_OK | os.X_OK):
            raise OutputError(f"{show(folder)}: {opt} cannot be created ('{show(probe)}' is not writable)")
        return folder


def make_output_folder(folder: str, opt: str) -> str:
    check_output_folder(folder, opt)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{show(folder)}: {opt} cannot be created ({e.strerror or e})") from None
    return folder


# --- temp files, leftovers, signals ----------------------------------------------------------------------------
def _owner() -> str:
    """Six hex digits naming this host and pid namespace: a pid is only meaningful there."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return hashlib.sha1(f"{socket.gethostname()}:{ns}".encode()).hexdigest()[:6]


_OWNER = _owner()


def _tmp_name(base: str) -> str:
    return f".{base[:_NAME_KEEP]}.qcompiler-{os.getpid()}-{_OWNER}-{secrets.token_hex(4)}.tmp"


def _lock_name(base: str) -> str:
    return f".{base[:_NAME_KEEP]}.qcompiler.lock"


def pid_alive(pid: int) -> bool:
    """Is a process with this pid running (or not ours to tell)? A pid past the C range names none."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    except OverflowError:
        return False
    return True


def _remove_tree(path: str) -> None:
    """Remove one of our temp entries: a file, or a temp folder holding only files (never followed links)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as it:
            for e in it:
                if not e.is_dir(follow_symlinks=False):
                    os.unlink(e.path)
        os.rmdir(path)
    else:
        os.unlink(path)


def remove_leftovers(folder: str) -> None:
    """Remove the temp files and lock files that killed qcompiler runs left in `folder` (once per process)."""
    try:
        key = os.path.realpath(folder)
    except (OSError, ValueError):
        return
    if key in _cleaned:
        return
    _cleaned.add(key)
    try:
        it = os.scandir(folder)
    except OSError:
        return
    with it:
        for e in it:
            if not e.name.startswith(".") or ".qcompiler" not in e.name:
                continue
            m = _TMP_RE.match(e.name)
            try:
                if m is not None:
                    if m.group(2) == _OWNER and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                        _remove_tree(e.path)
                elif _LOCK_RE.match(e.name) and e.is_file(follow_symlinks=False):
                    _remove_stale_lock(e.path)
            except OSError:
                pass


class _Interrupted(BaseException):
    """Raised by our SIGINT/SIGTERM handler inside a write, so `finally` clauses remove the temp files."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class SignalCleanup:
    """Around one write: SIGINT/SIGTERM interrupt it (temp files are removed), then the previous handlers are put
    back and the signal is delivered again to them, so the process ends as it would have without us.
    Use: `with SignalCleanup(): try: <write a temp file> finally: <remove it>`.

    Only in the main thread (Python runs signal handlers there); a signal whose handler is SIG_IGN stays ignored.
    While `committing` (the renames), a signal is only recorded and delivered once the renames are done.
    """

    SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)

    def __init__(self):
        self.previous: dict = {}
        self.got: Optional[int] = None
        self.committing = False

    def _handler(self, signum, frame):
        if self.got is None:
            self.got = signum
            if not self.committing:
                raise _Interrupted(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                prev = signal.getsignal(s)
                if prev is signal.SIG_IGN or prev is None:
                    continue
                self.previous[s] = prev
                signal.signal(s, self._handler)
        return self

    def __exit__(self, et, ev, tb):
        for s, h in self.previous.items():
            signal.signal(s, h)
        if self.got is None:
            return False
        signum, self.got = self.got, None
        signal.raise_signal(signum)   # SIG_DFL ends the process with this signal; Python's SIGINT handler raises
        if et is None:
            return False   # the signal came during the renames: the write is complete, the handler has run
        # the previous handler returned: the write was abandoned, say so the way the signal would have
        if signum == getattr(signal, "SIGINT", None):
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)


@contextmanager
def _folder_lock(folder: str, base: str):
    """An exclusive lock for the renames of one output (model + .data) against other processes.

    NOTE: the lock file is removed after use; a waiter that then gets the lock on the removed file sees that the
    name no longer points at the file it locked and tries again, so two holders can never overlap.
    """
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = os.path.join(folder, _lock_name(base))
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0),
                     0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            mine = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
                same = (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _remove_stale_lock(path: str) -> None:
    """Remove a lock file nobody holds (left by a run killed between its renames)."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return   # held: in use
    try:
        mine, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            os.unlink(path)
    finally:
        os.close(fd)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: str) -> None:
    try:
        _fsync_path(folder)
    except OSError:
        pass   # some filesystems cannot fsync a folder; the rename itself is still atomic


# --- writing ----------------------------------------------------------------------------------------------------
def write_through(target: Target, write: Callable) -> None:
    """Write into a character device (never created, renamed over or truncated): `/dev/null`, a terminal."""
    try:
        fd = os.open(target.path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise OutputError(f"{show(target.path)}: cannot write ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode):
            raise OutputError(f"{show(target.path)}: changed while being checked ({file_kind(st.st_mode)}); not written")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "wb", buffering=WRITE_BUFFER)
    except BaseException:
        os.close(fd)
        raise
    try:
        with f:
            write(f)
    except OSError as e:   # /dev/full (ENOSPC), a hung-up terminal (EIO): one line, as for a regular file
        if e.errno in _WRITE_ERRNOS or e.errno in (errno.EPIPE, errno.ENXIO, errno.EINVAL):
            raise OutputError(f"{show(target.path)}: cannot write ({e.strerror})") from None
        raise


def write_file(target: Target, write: Callable) -> None:
    """Write `target` atomically: `write(f)` fills a temp file beside it, which then replaces the final name."""
    remove_leftovers(target.folder)
    tmp = os.path.join(target.folder, _tmp_name(target.base))
    with SignalCleanup() as sig:
        # NOTE: the create is inside the try whose finally removes the temp file: a SIGINT/SIGTERM arriving just
        # after os.open returned (the moment the file appears, when a watcher signals) left it behind
        mine = True
        try:
            try:
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as e:
                mine = False   # not created by us: never remove it
                raise OutputError(f"{show(target.path)}: cannot write in '{show(target.folder)}' "
                                  f"({e.strerror or e})") from None
            with os.fdopen(fd, "wb", buffering=WRITE_BUFFER) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            sig.committing = True
            os.replace(tmp, target.path)
        except OSError as e:
            if e.errno in _WRITE_ERRNOS:
                raise OutputError(f"{show(target.path)}: cannot write ({e.strerror})") from None
            raise
        finally:
            if mine and os.path.lexists(tmp):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
    _fsync_folder(target.folder)


def write_pair(target: Target, write: Callable) -> None:
    """Write a model with external data: `write(tmp_model_path)` writes the model (and its `<base>.data`) in a
    temp folder beside the target; both then move to their final names under a lock.

    NOTE: the model and its `.data` must belong together. Each writer prepares both in its own temp folder and
    renames them (data first, then the model) while holding an fcntl lock on `.<base>.qcompiler.lock`, with
    SIGINT/SIGTERM held back, so two writers at once leave one writer's pair, never a mix. Only a SIGKILL in
    the microseconds between the two renames can leave the new .data beside the old model.
    """
    remove_leftovers(target.folder)
    tmpdir = os.path.join(target.folder, _tmp_name(target.base))
    with SignalCleanup() as sig:
        mine = True   # see write_file: the create is inside the try whose finally removes it
        try:
            try:
                os.mkdir(tmpdir, 0o700)
            except OSError as e:
                mine = False
                raise OutputError(f"{show(target.path)}: cannot write in '{show(target.folder)}' "
                                  f"({e.strerror or e})") from None
            tmp_model = os.path.join(tmpdir, target.base)
            # NOTE: onnx creates the .data file mode 0600; made here first, it gets the umask's permissions
            tmp_data = os.path.join(tmpdir, target.base + ".data")
            os.close(os.open(tmp_data, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666))
            write(tmp_model)
            if os.path.getsize(tmp_data) == 0:
                os.unlink(tmp_data)   # no tensor went out: no .data file
            names = os.listdir(tmpdir)
            for n in names:
                _fsync_path(os.path.join(tmpdir, n))
            with _folder_lock(target.folder, target.base):
                sig.committing = True
                for n in sorted(names, key=lambda n: n == target.base):   # the model last: it commits the pair
                    os.replace(os.path.join(tmpdir, n), os.path.join(target.folder, n))
        except OSError as e:
            if e.errno in _WRITE_ERRNOS:
                raise OutputError(f"{show(target.path)}: cannot write ({e.strerror})") from None
            raise
        finally:
            try:
                if mine:
                    _remove_tree(tmpdir)
            except OSError:
                pass
    _fsync_folder(target.folder)
