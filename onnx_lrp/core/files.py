"""Files written whole or not at all, and their digests: one atomic write and one hash for every stage.

Also what guards every output (the one place for it): temporary files with unpredictable names (``O_EXCL``, never
through a symlink) that carry the creating process's id, so that a later run removes those a killed run left
(:func:`remove_stale`); :func:`guard_outputs` (no output over an input, by resolved path), :func:`require_suffix`,
:class:`FolderLock` (one run per output folder) and :func:`printable` (control characters escaped in names written
to terminals, XML and images)."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import tempfile
import time
import weakref
from pathlib import Path
from typing import Callable, Iterable

from .errors import OutputError

TMP_PREFIX = ".onnx-lrp-tmp-"  # every temporary file: TMP_PREFIX + pid + "-" + random + "-" + target name
STALE_AFTER_S = 3600.0  # a temporary file this old whose process is gone is removed by the next run in its folder
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-")
_SWEPT: set[str] = set()  # folders this process has already cleared of stale temporaries


def file_mode(path: Path) -> int:
    """The mode of the file being replaced, or 0666 less the umask for a new file (what a plain open() gives)."""
    try:
        return Path(path).stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def temporary_beside(path: Path) -> tuple[int, Path]:
    """A new temporary file in ``path``'s folder (so that a rename onto ``path`` is atomic), with the mode a plain
    open() of ``path`` would give it: (open descriptor, its path)."""
    path = Path(path)
    folder = path.parent
    if str(folder) not in _SWEPT:
        remove_stale(folder)
        _SWEPT.add(str(folder))
    # mkstemp: a random name opened O_CREAT | O_EXCL (a symlink planted at the name makes it pick another, never
    # write through it); the target's name (shortened) only helps a reader see what it was for
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{TMP_PREFIX}{os.getpid()}-", suffix=f"-{path.name[:80]}")
    os.fchmod(fd, file_mode(path))  # mkstemp makes 0600
    return fd, Path(tmp)


def temporaries(folder) -> list[Path]:
    """The temporary files of onnx-lrp in ``folder`` (any process's, alive or not)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [Path(folder) / n for n in names if n.startswith(TMP_PREFIX)]


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):  # alive (another user's) or not a pid at all
        return False
    return False


def remove_stale(folder, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary files in ``folder`` left by killed runs: older than ``older_than_s`` and made by a process
    that no longer exists (its id is in the name). A symbolic link is removed, never followed. Best effort: a file
    that cannot be removed (another user's) stays. Returns those removed."""
    removed, now = [], time.time()
    for p in temporaries(folder):
        m = _TMP_NAME.match(p.name)
        try:
            st = p.lstat()
        except OSError:
            continue
        if m is None or now - st.st_mtime < older_than_s or not _process_gone(int(m.group(1))):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def fsync_dir(path: Path) -> None:
    """Make a rename in folder ``path`` durable (best effort: not every file system can)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data: "bytes | memoryview | Callable", sync_dir: bool = True) -> None:
    """Write ``data`` (bytes, or ``writer(binary_file)``) to a temporary file beside ``path``, fsync, rename:
    ``path`` is either absent, old, or whole.

    ``sync_dir`` also makes the rename durable at once (dataset shards skip it: the manifest lists a shard only with
    its checksum, and a rerun redoes a listed shard whose file is missing or differs)."""
    path = Path(path)
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            data(f) if callable(data) else f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(path.parent)


def sha256_file(path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- output guards
def _file_key(path) -> "tuple | None":
    """(device, inode) of the file ``path`` names (through symlinks), None if there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def same_file(a, b) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path, or the same file through a link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    ka = _file_key(a)
    return ka is not None and ka == _file_key(b)


def _input_hit(out: Path, inputs: list, suffixes) -> "tuple | None":
    """The (what, path) of ``inputs`` that the existing file ``out`` is (a folder input: a file directly in it, not
    hidden, with one of ``suffixes`` when given: one the folder's reader reads)."""
    real, key = os.path.realpath(out), _file_key(out)
    item = suffixes is None or (not os.path.basename(real).startswith(".")
                                and os.path.splitext(real)[1].lower() in suffixes)
    for what, p in inputs:
        if os.path.isdir(p):
            if item and os.path.dirname(real) == os.path.realpath(p) and not os.path.isdir(out):
                return f"{what} (a file of {p})", out
        elif os.path.realpath(p) == real or (key is not None and key == _file_key(p)):
            return what, p
    return None


def guard_outputs(inputs: Iterable, outputs: Iterable, folder_suffixes: "Iterable[str] | None" = None) -> None:
    """Refuse (:class:`OutputError`, one line naming both paths) before anything is written when an output names
    one of the inputs or two outputs name one file, compared by resolved path and by file identity (symlinks and hard
    links count).

    ``inputs``: (what, path) pairs, e.g. ("the model", "m.onnx"), ("the baseline", "base.npz"); a folder stands for
    every file directly in it (a folder of images; with ``folder_suffixes``, only its files with those suffixes, not
    hidden: the items its reader reads). ``outputs``: (option, path) pairs, e.g. ("--junit-xml", "out.xml"); None
    paths are skipped. Only an output that exists can be an input: the inputs are looked at then."""
    suffixes = None if folder_suffixes is None else tuple(s.lower() for s in folder_suffixes)
    outs = [(opt, Path(p)) for opt, p in outputs if p is not None]
    ins = [(what, Path(p)) for what, p in inputs if p is not None]
    seen: dict = {}
    for opt, out in outs:
        exists = os.path.lexists(out)
        hit = _input_hit(out, ins, suffixes) if exists else None
        if hit is not None:
            what, p = hit
            same = "" if os.path.abspath(p) == os.path.abspath(out) else f" ({p})"
            raise OutputError(f"{opt} {out} is {what}{same}; writing it would destroy that input: write to "
                              "another file")
        real = os.path.realpath(out)
        other = seen.get(real)
        if other is not None:
            raise OutputError(f"{other[0]} and {opt} both name {out}; give two different files")
        seen[real] = (opt, out)


def require_suffix(option: str, path, suffixes: Iterable[str], what: str) -> None:
    """Refuse an output file whose name does not end in one of ``suffixes`` (case-insensitive), e.g. a JSON report
    named ``model.onnx``."""
    suffixes = tuple(suffixes)
    if Path(path).suffix.lower() not in suffixes:
        raise OutputError(f"{option} {path}: {what} is written as {' / '.join(suffixes)}; give a name ending in "
                          f"{suffixes[0]}")


# ---------------------------------------------------------------------------------------------- folder lock
LOCK_NAME = ".onnx-lrp.lock"
_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # lock file (resolved) -> this process's holder


class FolderLock:
    """An exclusive lock on an output folder for one run: ``fcntl.flock`` on ``FOLDER/.onnx-lrp.lock`` (created with
    ``O_EXCL``, opened without following a symlink, holding the holder's process id). A second run refuses at once,
    naming the holder; the lock goes with the process (a killed run holds nothing). The file stays (removing it
    would let two runs lock two different files). Within one process a new lock takes over one still held by an
    earlier object (a run that raised, its object kept alive by the traceback): the lock is between processes."""

    def __init__(self, folder, option: str = "--out-dir"):
        import fcntl
        import stat

        folder = Path(folder)
        self.path, self.fd = folder / LOCK_NAME, None
        key = os.path.realpath(self.path)
        prev = _HELD.get(key)
        if prev is not None and prev.fd is not None:
            self.fd, prev.fd = prev.fd, None
            _HELD[key] = self
            return
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                fd = os.open(self.path, flags)
        except OSError as exc:
            why = "it is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
            raise OutputError(f"{option} {folder}: cannot open its lock file {self.path} ({why}); remove it if no "
                              "run uses the folder") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(f"{option} {folder}: its lock file {self.path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise OutputError(f"{option} {folder} is in use by process {printable(holder)} (lock {self.path}); "
                              f"wait for that run to finish, or choose another {option}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        _HELD[key] = self

    def release(self) -> None:
        if getattr(self, "fd", None) is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------- names shown
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def printable(text) -> str:
    """``text`` with every control character escaped as text (``\\x1b``, ``\\x0a``, ``\\u202e``): C0, DEL, C1,
    the line / paragraph separators, bidirectional overrides and lone surrogates (undecodable file-name bytes). What
    names go through before they reach a terminal, an XML file or an image caption: an escape sequence in a node or
    file name cannot retitle the terminal, break the XML or draw a second line."""
    return _CONTROL.sub(_escape, str(text))


__all__ = ["FolderLock", "STALE_AFTER_S", "TMP_PREFIX", "atomic_write", "file_mode", "fsync_dir", "guard_outputs",
           "printable", "remove_stale", "require_suffix", "same_file", "sha256_file", "temporaries",
           "temporary_beside"]
