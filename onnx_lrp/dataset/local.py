"""The local engine: reading/decoding in a thread pool (``workers`` shards ahead) and writing in one thread overlap
the onnxruntime run in the calling thread (onnxruntime releases the GIL); at most ``workers + 4`` shards are in
memory, so the peak does not grow with the dataset. Also what both engines share: the resumable output
(:class:`Output`: the manifest and errors.jsonl) and the progress line."""
from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..core.errors import InputError, OutputError
from ..core.files import FolderLock, atomic_write, sha256_file, temporaries
from .shards import ERRORS, MANIFEST, SHARD_DIR, ShardJob, Span, check_out_dir, compute_shard, write_shard
from .sources import Source


class Output:
    """OUT: the manifest (one JSON file, rewritten atomically after each shard) and errors.jsonl (from it)."""

    def __init__(self, out_dir, header: dict, shard_size: int, overwrite: bool):
        self.dir = Path(out_dir)
        self.header = header
        self.shard_size = shard_size
        self.lock = threading.Lock()
        if self.dir.exists() and not self.dir.is_dir():
            raise OutputError(f"--out-dir {self.dir} is a file; give a directory")
        check_out_dir(self.dir, header.get("source", {}))
        try:
            (self.dir / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {self.dir}: {exc.strerror or exc}; choose a writable directory") \
                from None
        if not os.access(self.dir, os.W_OK):
            raise OutputError(f"--out-dir {self.dir} is not writable; choose another directory")
        self.folder_lock = FolderLock(self.dir)  # one run per OUT: a second exits at once, naming the holder
        self.done: dict[int, dict] = {}
        old = None if overwrite else self._read()
        if old is not None:
            diff = [k for k in MATCH_KEYS if old.get(k) != header.get(k)]
            if diff:
                raise InputError(f"--out-dir {self.dir} holds a run with another {', '.join(diff)} "
                                 f"({MANIFEST} does not match this command); use another --out-dir, or --overwrite "
                                 "to discard it")
            for rec in old.get("shards", []):  # a shard counts as done only when its file is whole
                p = self.dir / rec["file"]
                if p.is_file() and sha256_file(p) == rec["sha256"]:
                    self.done[int(rec["index"])] = rec
        stale = [*temporaries(self.dir / SHARD_DIR), *temporaries(self.dir)]  # under the lock: a killed run's
        if overwrite:
            stale += [self.dir / MANIFEST, self.dir / ERRORS, *(self.dir / SHARD_DIR).glob("part-*.npz")]
        for p in stale:  # temporary files of a killed run, never visible under the shard names
            if p.exists():
                p.unlink()
        self.resumed = len(self.done)
        self.saved_at = -float("inf")
        self.first_at = None  # perf_counter when this run's first shard was recorded

    def _read(self):
        p = self.dir / MANIFEST
        if not p.exists():
            return None
        return read_manifest(p, "use --overwrite to start again")

    def add(self, rec: dict) -> None:
        """Record a written shard; the manifest is rewritten at most every MANIFEST_EVERY_S seconds (and at the
        end), so its cost stays small for many shards: a killed run redoes at most that much work."""
        with self.lock:
            self.done[int(rec["index"])] = rec
            if self.first_at is None:
                self.first_at = time.perf_counter()
            now = time.monotonic()
            if now - self.saved_at >= MANIFEST_EVERY_S:
                self.save()
                self.saved_at = now

    def failed(self) -> list:
        return [f for i in sorted(self.done) for f in self.done[i]["failed"]]

    def manifest(self, complete: bool = False) -> dict:
        shards = [self.done[i] for i in sorted(self.done)]
        return dict(self.header, shards=shards, failed=self.failed(), complete=complete,
                    explained=sum(s["explained"] for s in shards))

    def save(self, complete: bool = False) -> None:
        # compact JSON: the C encoder, no per-entry chunks (the manifest is rewritten after every shard)
        atomic_write(self.dir / MANIFEST, (json.dumps(self.manifest(complete), separators=(",", ":")) + "\n").encode())
        if complete:
            lines = "".join(json.dumps(f) + "\n" for f in self.failed())
            atomic_write(self.dir / ERRORS, lines.encode())


MANIFEST_EVERY_S = 1.0


def read_manifest(path, hint: str) -> dict:
    """A dataset run's manifest, every field a resume or a reader uses checked: one line naming the field
    otherwise; a shard's ``file`` must stay inside the manifest's folder."""
    from ..core.validate import expect, expect_int, inside, read_json

    p = Path(path)
    m = expect(read_json(p, f"manifest {p}", hint), dict, f"manifest {p}", hint)
    for i, rec in enumerate(expect(m.get("shards", []), list, f"manifest {p}: shards", hint)):
        where = f"manifest {p}: shards[{i}]"
        expect(rec, dict, where, hint)
        expect_int(rec.get("index"), f"{where}.index", 0, None, hint)
        expect(rec.get("sha256"), str, f"{where}.sha256", hint)
        expect_list_of_failed = expect(rec.get("failed", []), list, f"{where}.failed", hint)
        for j, f in enumerate(expect_list_of_failed):
            expect(f, dict, f"{where}.failed[{j}]", hint)
        expect_int(rec.get("explained", 0), f"{where}.explained", 0, None, hint)
        if "file" not in rec:
            raise InputError(f"{where} lacks 'file'; {hint}")
        inside(p.parent, rec["file"], f"{where}.file")
    return m


MATCH_KEYS = ("format", "model_sha256", "composite", "parameters", "source", "shard_size", "item_count")


class Progress:
    """Items/s and ETA on stderr, at most once a second, and once at the end."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.total, self.enabled, self.stream = total, enabled, stream or sys.stderr
        self.count = 0
        self.t0 = self.last = time.perf_counter()

    def update(self, n: int, final: bool = False) -> None:
        self.count += n
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < 1.0):
            return
        self.last = now
        rate = self.count / max(now - self.t0, 1e-9)
        left = (self.total - self.count) / rate if rate > 0 else float("inf")
        eta = time.strftime("%H:%M:%S", time.gmtime(left)) if np.isfinite(left) else "?"
        self.stream.write(f"onnx-lrp: {self.count}/{self.total} items ({100 * self.count / max(self.total, 1):.0f} "
                          f"%), {rate:.1f} items/s, ETA {eta}\n")
        self.stream.flush()


def run_local(ex, source: Source, todo: list[tuple[int, int, int]], out: Output, options, targets, start,
              progress: Progress) -> None:
    """Read ``options.workers`` shards ahead in a thread pool (default: up to 4), explain in this thread, write in one
    writer thread. ``options``: :class:`onnx_lrp.dataset.DatasetOptions`."""
    workers = max(1, int(options.workers or min(4, cpu_cores())))
    batch_size = options.batch_size
    pending_reads: collections.deque = collections.deque()
    pending_writes: collections.deque = collections.deque()
    shards = iter(todo)
    with ThreadPoolExecutor(workers, thread_name_prefix="lrp-read") as readers, \
            ThreadPoolExecutor(1, thread_name_prefix="lrp-write") as writer:
        def submit_read():
            nxt = next(shards, None)
            if nxt is not None:
                pending_reads.append((nxt, readers.submit(source.read, nxt[1], nxt[2])))

        def write(res):
            rec = write_shard(out.dir, res)
            out.add(rec)
            return res.hi - res.lo

        for _ in range(workers + 1):
            submit_read()
        try:
            while pending_reads:
                (index, lo, hi), fut = pending_reads.popleft()
                ok, bad = fut.result()
                submit_read()
                res = compute_shard(ex, Span(source, index, lo, hi), ok, bad, ShardJob(batch_size, targets, start))
                while len(pending_writes) >= 2:  # bounded: at most two shards waiting to be written
                    progress.update(pending_writes.popleft().result())
                pending_writes.append(writer.submit(write, res))
            while pending_writes:
                progress.update(pending_writes.popleft().result())
        except BaseException:
            for _, fut in pending_reads:
                fut.cancel()
            for fut in pending_writes:
                fut.cancel()
            raise


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


__all__ = ["Output", "Progress", "run_local", "cpu_cores", "MATCH_KEYS"]
