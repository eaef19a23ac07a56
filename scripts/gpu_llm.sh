#!/usr/bin/env bash
# The LLaMA rows of the GPU check (issue 29): benchmarks/bench_llm.py in bfloat16 on CUDA, model precision, the
# graph written directly (llama_graph.py: no torch export), against its float32 twin. Each row prints its goals line
# (peak GPU memory vs the weights, explain / forward, rel-L2 and top-10 tokens vs the float32 twin) and writes
# $OUT/llm_<size>.json. Sizes: $LLM_SIZES (default "1b 8b"); each row under $LLM_TIMEOUT seconds (default 300).
# Usage: scripts/gpu_llm.sh [--cpu]      (--cpu: the same rows on the CPU at tiny / 0.1b sizes: a dry run)
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-$(mktemp -d)} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PY=${PYTHON:-python3}
dev=cuda; sizes=${LLM_SIZES:-1b 8b}
if [ "${1:-}" = "--cpu" ]; then dev=cpu; sizes=${LLM_SIZES:-tiny 0.1b}; fi
df -h "${TMPDIR:-/tmp}" | tail -1
for size in $sizes; do
  echo "=== bench_llm $size bfloat16 on $dev ($(date -u +%H:%M:%S))"
  timeout "${LLM_TIMEOUT:-300}" $PY benchmarks/bench_llm.py --size "$size" --dtype bfloat16 --device $dev \
    --precision auto --build direct --json "$OUT/llm_$size.json" 2>&1 | grep -v "^  "
  echo "exit ${PIPESTATUS[0]}"
done
