"""Offline fuzz campaign: mutate small valid models and feed them to ``Explainer(...).explain(...)``.

Every result must be finite relevance of the input's shape or an ``LrpError``; this prints the counts per outcome
and the distinct crashes (non-LrpError exceptions, or LrpErrors that report an internal error).

    .venv/bin/python scripts/fuzz_models.py --n 5000 --seed 0

The mutations live in tests/mutate.py (shared with tests/test_fuzz.py).
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import mutate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="number of mutated models")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=40, help="distinct crash messages to print")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rnd = random.Random(args.seed)
    seeds = mutate.seed_models()
    counts = collections.Counter()
    crashes = collections.Counter()
    by_kind = collections.Counter()
    t0 = time.perf_counter()
    for i in range(args.n):
        name = rnd.choice(sorted(seeds))
        model = seeds[name]
        kind = rnd.choice(mutate.KINDS)
        data = mutate.mutate(model, rnd, kind)
        x = mutate.sample_input(model, rnd)
        comp, params = rnd.choice(mutate.COMPOSITES)
        result, detail = mutate.outcome(data, x, comp, params)
        counts[result] += 1
        if result in ("crash", "nonfinite", "wrong_shape"):
            crashes[f"{result}: {detail} [{name}/{kind}]"] += 1
            by_kind[kind] += 1
        if (i + 1) % 500 == 0:
            print(f"{i + 1} models, {time.perf_counter() - t0:.0f} s: {dict(counts)}", file=sys.stderr, flush=True)
    print(f"{args.n} mutated models (seed {args.seed}) in {time.perf_counter() - t0:.0f} s")
    for k in ("ok", "refused", "crash", "nonfinite", "wrong_shape"):
        print(f"  {k:12s} {counts[k]}")
    if crashes:
        print(f"{len(crashes)} distinct failures (count, outcome: detail [seed/mutation]):")
        for msg, c in crashes.most_common(args.show):
            print(f"  {c:5d}  {msg}")
    return 1 if counts["crash"] + counts["nonfinite"] + counts["wrong_shape"] else 0


if __name__ == "__main__":
    sys.exit(main())
