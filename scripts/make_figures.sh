#!/usr/bin/env bash
# Rebuild the heatmaps shown in README.md with the installed `onnx-lrp` command (run from the repository root).
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 1. every sample digit, explained for its predicted class
onnx-lrp explain models/digits_cnn.onnx models/samples/png -o "$tmp/all.npz" --heatmap docs/digits_heatmap.png
# 2. one digit (a 3) explained for each of the ten classes: what speaks for and against each answer
python - "$tmp/three.npy" <<'PY'
import sys, numpy as np
np.save(sys.argv[1], np.repeat(np.load("models/samples/npy/digit_3.npy")[None], 10, axis=0))
PY
onnx-lrp explain models/digits_cnn.onnx "$tmp/three.npy" --target 0,1,2,3,4,5,6,7,8,9 -o "$tmp/three.rel.npy" \
    --heatmap docs/digit3_all_targets.png --heatmap-style heatmap
# 3. concepts (CRP): the six channels of the last Conv that the 3 relies on most, each with its own heatmap
onnx-lrp concepts models/digits_cnn.onnx models/samples/npy/digit_3.npy --layer /features/features.6/Conv_output_0 \
    --top 6 --heatmap docs/concepts.png
