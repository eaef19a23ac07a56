"""Files written whole or not at all, and their digests: one atomic write and one hash for every stage."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, file_mode(path))  # mkstemp makes 0600
    return fd, Path(tmp)


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


__all__ = ["atomic_write", "file_mode", "fsync_dir", "sha256_file", "temporary_beside"]
