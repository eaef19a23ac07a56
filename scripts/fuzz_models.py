"""Offline fuzz campaign: mutate small valid models and feed them to ``Explainer(...).explain(...)``.

Every result must be finite relevance of the input's shape or an ``LrpError``; this prints the counts per outcome
and the distinct crashes (non-LrpError exceptions, or LrpErrors that report an internal error).

    .venv/bin/python scripts/fuzz_models.py --n 5000 --seed 0

The mutations live in tests/mutate.py (shared with tests/api/test_fuzz.py).
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import mutate  # noqa: E402

MEMORY_LIMIT = 6 << 30  # bytes of address space per worker


def case(seed: int, i: int, seeds: dict):
    """The i-th case of a campaign: (seed model name, mutation kind, bytes, input, composite, params)."""
    rnd = random.Random(seed * 1_000_003 + i)
    name = rnd.choice(sorted(seeds))
    kind = rnd.choice(mutate.KINDS)
    data = mutate.mutate(seeds[name], rnd, kind)
    x = mutate.sample_input(seeds[name], rnd)
    comp, params = rnd.choice(mutate.COMPOSITES)
    return name, kind, data, x, comp, params


def worker(seed: int, start: int, n: int) -> None:
    """Run cases start..n-1, one JSON line each (a native crash ends the process; the parent goes on)."""
    warnings.simplefilter("ignore")
    # a mutated dimension of 2**30 must not take the machine: allocations beyond this fail (MemoryError)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    seeds = mutate.seed_models()
    for i in range(start, n):
        name, kind, data, x, comp, params = case(seed, i, seeds)
        print(json.dumps(dict(i=i, start=True)), flush=True)
        result, detail = mutate.outcome(data, x, comp, params)
        print(json.dumps(dict(i=i, result=result, detail=detail, seed=name, kind=kind, composite=comp)), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="number of mutated models")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=40, help="distinct failures to print")
    ap.add_argument("--dump", default=None, help="write every case's outcome as a JSON line to this file")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.seed, args.worker, args.n)
        return 0
    counts = collections.Counter()
    failures = collections.Counter()
    t0 = time.perf_counter()
    dump = open(args.dump, "w") if args.dump else None
    i = 0
    while i < args.n:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--n", str(args.n), "--seed",
                                 str(args.seed)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        current = None
        for line in proc.stdout:
            rec = json.loads(line)
            if rec.get("start"):
                current = rec["i"]
                continue
            current = None
            if dump:
                dump.write(line)
            i = rec["i"] + 1
            counts[rec["result"]] += 1
            if rec["result"] not in ("ok", "refused"):
                failures[f"{rec['result']}: {rec['detail']} [{rec['seed']}/{rec['kind']}]"] += 1
            if i % 500 == 0:
                print(f"{i} models, {time.perf_counter() - t0:.0f} s: {dict(counts)}", file=sys.stderr, flush=True)
        proc.wait()
        if current is not None:  # the process died inside a case (a native crash in onnx or onnxruntime)
            counts["died"] += 1
            failures[f"died: exit {proc.returncode} [case {current}]"] += 1
            i = current + 1
    print(f"{args.n} mutated models (seed {args.seed}) in {time.perf_counter() - t0:.0f} s")
    for k in ("ok", "refused", "crash", "nonfinite", "wrong_shape", "died"):
        print(f"  {k:12s} {counts[k]}")
    if failures:
        print(f"{len(failures)} distinct failures (count, outcome: detail [seed/mutation]):")
        for msg, c in failures.most_common(args.show):
            print(f"  {c:5d}  {msg}")
    return 1 if sum(counts[k] for k in ("crash", "nonfinite", "wrong_shape", "died")) else 0


if __name__ == "__main__":
    sys.exit(main())
