#!/usr/bin/env bash
# The review of the GPU-shaped step (issue 37) on a lent GPU, in one call of about 7 minutes:
# the device tests of packing, mixed adapters, decoding, microbatches and placement, then
# bench/gpu.py with --profile (every row of docs/benchmarks.md "On one GPU", and one update's and
# one rollout's profile beside the JSON). Here, once: ../shared/gpu/prepare.sh (writes .gpu/).
# There: run(command="bash bench/gpu_review.sh", carry=[".gpu"]). Results land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source .gpu/setup.sh
OUT=${OUT:-/tmp/gpu-review}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/device.txt"
timeout 150 python3 -m pytest -p no:cacheprovider -q -m "not slow" \
  tests/agents/test_packing.py tests/agents/test_mixed_lora.py tests/agents/test_decode_loop.py \
  tests/marl/test_microbatches.py tests/marl/test_placement.py tests/marl/test_machine.py \
  2>&1 | tail -30 | tee "$OUT/tests.txt"
timeout 330 python3 bench/gpu.py --model-path /tmp/smol --profile --budget-s 240 --out "$OUT" \
  2>&1 | tail -45 | tee "$OUT/bench.txt"
