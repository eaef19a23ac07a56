#!/usr/bin/env bash
# The GPU check (issue 29), in one run of at most 8 minutes on the device machine (../shared/hooks/gpu/README.md:
# onnxruntime-gpu and the project wheel installed into /tmp/site, PYTHONPATH=/tmp/site). Steps in priority order, each
# under its own time limit (never past the budget left), then one summary table:
#   1. the CUDA tests: every family CUDA vs CPU, no relevance node on the CPU provider (onnxruntime's own placement),
#      device arrays left on the GPU, a quiet command line; the CUDA-safety, placement, IOBinding and quiet tests
#   2. the family sweep: explain on CUDA, relevance vs the CPU's, TF32 off / on   (scripts/gpu_check.py sweep)
#   3. bench_cnn: ResNet50 / VGG16 at b16 and b128, epsilon-plus-flat and epsilon-gamma-box, zennit on the same GPU,
#      the time split: kernels (onnxruntime's profile), session wall, explain wall, the share outside the run
#   4. BERT-base attnlrp, b1 / b16                                                (scripts/gpu_check.py bert)
#   5. bench_llm 1 B and 8 B in bfloat16, written directly (scripts/gpu_llm.sh)
#   6. the command line with --device cuda / auto and the dataset engine          (scripts/gpu_check.py engine)
#   7. onnxruntime's profile of the worst bench_cnn row -> $OUT/profile_worst.json
# Usage: scripts/gpu_check.sh [--cpu]   (--cpu: every step with the CPU provider at tiny sizes: the rehearsal)
# The tests run as `python -P -m pytest` so that the installed onnx-lrp (the wheel) is tested, not the checkout's
# folder. Logs: $OUT/gpu_check.log, $OUT/results.jsonl, $OUT/steps.tsv (OUT defaults to a new temporary folder).
# GPU_CHECK_BUDGET (seconds, default 480; 3x that with --cpu) is the whole run's; GPU_CHECK_SKIP lists steps to leave
# out (e.g. "llm-8b"). The limits sum to the budget: cuda-tests 90, family-sweep 35, bench-cnn 100, bert-base 40,
# llm-1b 45, llm-8b 110, cli-engine 40, worst-profile 10 (a step never gets more than the budget left).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-$(mktemp -d)} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
: > "$OUT/steps.tsv"
PY=${PYTHON:-python3}
SKIP=" ${GPU_CHECK_SKIP:-} "
T0=$(date +%s)
dev=cuda; quick=""; llm1=1b; llm2=8b; scale=1
cnn=(--models resnet50,vgg16 --batches 16,128 --size 224 --repeat 3)
if [ "${1:-}" = "--cpu" ]; then  # the rehearsal: tiny sizes, and 3x the limits (a shared 2-core machine)
  dev=cpu; quick="--quick"; llm1=tiny; llm2=tiny; scale=3
  cnn=(--models resnet18 --batches 1,2 --size 64 --repeat 2)
fi
BUDGET=${GPU_CHECK_BUDGET:-$((480 * scale))}

# step NAME LIMIT COMMAND...: runs COMMAND under min(LIMIT, budget left) seconds and records how it ended
step() {
  local name=$1 cap=$(($2 * scale))
  shift 2
  local left=$((BUDGET - ($(date +%s) - T0)))
  ((cap > left)) && cap=$left
  if [[ "$SKIP" == *" $name "* ]] || ((cap < 5)); then
    echo "=== $name: skipped"
    printf '%s\t%s\t%s\t%s\n' "$name" 0 0 skipped >> "$OUT/steps.tsv"
    return
  fi
  echo
  echo "=== $name (limit ${cap} s, $(date -u +%H:%M:%S))"
  local start=$(date +%s)
  timeout --kill-after=10 "$cap" "$@"
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$cap" "$(($(date +%s) - start))" "$rc" >> "$OUT/steps.tsv"
}

{
  echo "=== environment"
  $PY -c "import onnxruntime as o, onnx_lrp, sys; print('python', sys.version.split()[0], 'onnxruntime', o.__version__, o.get_available_providers(), 'onnx_lrp from', onnx_lrp.__file__)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  step cuda-tests 90 env ONNX_LRP_PARITY_DEVICE=$dev $PY -P -m pytest -q -W ignore -p no:cacheprovider \
    tests/run/test_cuda.py tests/run/test_cuda_safe.py tests/run/test_placement.py tests/run/test_quiet_cuda.py tests/run/test_iobinding.py
  step family-sweep 35 $PY scripts/gpu_check.py sweep --device $dev $quick
  step bench-cnn 100 $PY benchmarks/bench_cnn.py --device $dev "${cnn[@]}" \
    --composites epsilon-plus-flat,epsilon-gamma-box --profile --json "$OUT/results.jsonl"
  step bert-base 40 $PY scripts/gpu_check.py bert --device $dev $quick
  step llm-1b 45 env LLM_SIZES=$llm1 LLM_TIMEOUT=$((43 * scale)) bash scripts/gpu_llm.sh ${quick:+--cpu}
  step llm-8b 110 env LLM_SIZES=$llm2 LLM_TIMEOUT=$((108 * scale)) bash scripts/gpu_llm.sh ${quick:+--cpu}
  step cli-engine 40 $PY scripts/gpu_check.py engine --device $dev $quick
  step worst-profile 10 $PY scripts/gpu_check.py profile
  echo
  echo "=== summary ($(($(date +%s) - T0)) s of the ${BUDGET} s budget)"
  $PY scripts/gpu_check.py summary
} 2>&1 | tee "$OUT/gpu_check.log"
