#!/usr/bin/env bash
# The GPU check of issues 18 and 20, in one run on the device machine (DEVELOPERS.md / ../shared/hooks/gpu):
#   1. the CUDA tests (tests/test_cuda.py: every family CUDA vs CPU; test_cuda_safe.py)
#   2. the family sweep: explain on CUDA, relevance vs CPU rel-L2 with TF32 off and on (scripts/gpu_check.py sweep)
#   3. BERT-base attnlrp on CUDA, b1 / b16, TF32 off / on, next to PyTorch's forward + backward
#   4. benchmarks/bench_cnn.py --device cuda: ResNet50 / VGG16 at b1, b16, b64, epsilon-plus-flat and
#      epsilon-gamma-box (TF32 off, the default)
#      and their relevance vs the CPU's, TF32 off and on (gpu_check.py fullsize)
#   5. --device cuda through the CLI (and --device auto) and the dataset engine: ResNet50 EPF images/s
#   6. bench_cnn at b16 with --tf32;  7. float16 / bfloat16 relevance in the model's precision (gpu_check.py
#      precision) and benchmarks/bench_llm.py on CUDA in bfloat16 (model precision, vs its float32 twin)
# Usage: scripts/gpu_check.sh [--cpu]      (--cpu: every part with the CPU provider, small sizes: a dry run)
# Logs: $OUT/gpu_check.log and $OUT/results.jsonl (OUT defaults to a new temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-$(mktemp -d)} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
dev=cuda; quick=""; cnn="--models resnet50,vgg16 --batches 1,16,64 --size 224"
if [ "${1:-}" = "--cpu" ]; then dev=cpu; quick="--quick"; cnn="--models resnet18 --batches 1,2 --size 64 --repeat 2"; fi
PY=${PYTHON:-python3}
log=$OUT/gpu_check.log
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
{
  step "environment"
  $PY -c "import onnxruntime as o, onnx_lrp, sys; print('python', sys.version.split()[0], 'onnxruntime', o.__version__, o.get_available_providers())"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  step "1. CUDA tests"
  ONNX_LRP_PARITY_DEVICE=$dev timeout 150 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_cuda_safe.py 2>&1 | tail -15
  step "2. family sweep"
  timeout 120 $PY scripts/gpu_check.py sweep --device $dev $quick
  step "3. BERT-base attnlrp"
  timeout 150 $PY scripts/gpu_check.py bert --device $dev $quick
  step "4. bench_cnn (TF32 off)"
  timeout 200 $PY benchmarks/bench_cnn.py --device $dev $cnn --composites epsilon-plus-flat,epsilon-gamma-box --no-zennit
  step "4c. ResNet50 / VGG16 relevance vs CPU"
  timeout 150 $PY scripts/gpu_check.py fullsize --device $dev $quick
  step "5. CLI and dataset engine"
  timeout 150 $PY scripts/gpu_check.py engine --device $dev $quick
  step "6. bench_cnn b16 with TF32"
  [ "$dev" = cuda ] && timeout 120 $PY benchmarks/bench_cnn.py --device cuda --tf32 --models resnet50,vgg16 --batches 16 --composites epsilon-plus-flat,epsilon-gamma-box --no-zennit
  step "7. float16 / bfloat16 in the model's precision"
  timeout 150 $PY scripts/gpu_check.py precision --device $dev $quick
  step "7b. bench_llm (bfloat16, model precision)"
  llm="--size 0.1b"; [ "$dev" = cpu ] && llm="--size tiny"
  timeout 200 $PY benchmarks/bench_llm.py ${BENCH_LLM_ARGS:---device $dev --dtype bfloat16 --precision auto $llm}
  step "done"
} 2>&1 | tee "$log"
