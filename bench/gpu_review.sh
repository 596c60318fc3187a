#!/usr/bin/env bash
# The review on a lent GPU, in one call of at most $LIMIT seconds (570): issue 39's sweep that
# shares the GPU, then issue 37's GPU-shaped step, then the device tests, each with what is left.
# 1. bench/sweep_wall.py: 8 shortened demo jobs on the Ray launcher, 1/8 of the GPU each, against
#    one job launched serially (jobs per hour; random weights, so the synthetic reward).
# 2. bench/gpu.py --profile: every row of docs/benchmarks.md "On one GPU", and one update's and
#    one rollout's profile beside the JSON.
# 3. the device tests of packing, mixed adapters, decoding, microbatches and placement.
# Here, once: ../shared/gpu/prepare.sh (writes .gpu/), then bench/gpu_prepare.sh (adds
# huggingface_hub and Ray).
# There, from a checkout with .gpu/ carried beside it: bash bench/gpu_review.sh. Results land in $OUT.
# SWEEP=0 leaves out part 1; BENCH_ARGS adds arguments to bench/gpu.py (the first H200 run's
# budget ran out before the demo and 256-episode steps: BENCH_ARGS="--skip generation" reaches them).
# SWEEP_SEEDS and SWEEP_RAY (one override of the Ray side) change the sweep: its 8 jobs kept 7.6
# of the H200 host's 16 cores busy, so SWEEP_SEEDS="$(seq -s ' ' 0 15)"
# SWEEP_RAY=hydra.launcher.jobs_per_gpu=16 asks whether 16 jobs a GPU do better. SWEEP_TIMEOUT
# (150 s) stops each of the sweep's two sides after that long; SWEEP_NAME (sweep_gpu) names its JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
left() { echo $(( ${LIMIT:-570} - (SECONDS - began) )); }
source .gpu/setup.sh || exit 1
# transformers 5 loads hub kernels by default; the GPU machine is offline and its own `kernels`
# package is not of transformers' range, so loading a model would fail: keep torch's layers
export USE_HUB_KERNELS=0
OUT=${OUT:-/tmp/gpu-review}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/device.txt"
nproc | tee -a "$OUT/device.txt"
if [ -f .gpu/ray/ray-site.tar.xz ]; then  # bench/gpu_prepare.sh's Ray, after setup.sh's site
  mkdir -p /tmp/raysite && tar -C /tmp/raysite -xJf .gpu/ray/ray-site.tar.xz \
    && python3 -m pip install -q --no-index --no-deps --target /tmp/raysite .gpu/ray/*.whl \
       >/dev/null 2>&1
  export PYTHONPATH=$PYTHONPATH:/tmp/raysite
fi
python3 -c "import ray; print('ray', ray.__version__)" 2>&1 | tail -1 | tee -a "$OUT/device.txt"
echo "setup took $((SECONDS - began)) s" | tee -a "$OUT/device.txt"
# the CUDA-graph decoding test first, whole (it failed on the first H200 run)
timeout 60 python3 -m pytest -p no:cacheprovider -q --tb=long -rf \
  "tests/agents/test_decode_loop.py::test_cuda_graph_replays_equal_the_eager_static_loop" \
  > "$OUT/decode_test.txt" 2>&1; tail -5 "$OUT/decode_test.txt"

# shellcheck disable=SC2086  # the seeds are a list
[ "${SWEEP:-1}" = 0 ] || timeout $(( ${SWEEP_TIMEOUT:-150} * 2 + 40 )) python3 bench/sweep_wall.py \
  --rounds 1 --seeds ${SWEEP_SEEDS:-0 1 2 3 4 5 6 7} --serial-seeds 0 --synthetic-reward \
  --timeout-s "${SWEEP_TIMEOUT:-150}" \
  --out "$OUT" --name "${SWEEP_NAME:-sweep_gpu}" ${SWEEP_RAY:+--ray-override $SWEEP_RAY} \
  model.kind=hf model.path=/tmp/smol \
  2>&1 | tail -30 | tee "$OUT/sweep.txt"

t=$(left)
if [ "$t" -gt 90 ]; then
  timeout $((t - 10)) python3 bench/gpu.py --model-path /tmp/smol --profile \
    --budget-s $((t - 100 > 30 ? t - 100 : 30)) --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tail -45 | tee "$OUT/bench.txt"
fi
t=$(left)
if [ "$t" -gt 40 ]; then
  timeout $((t - 5)) python3 -m pytest -p no:cacheprovider -q -m "not slow" --tb=short -rf \
    tests/agents/test_packing.py tests/agents/test_mixed_lora.py tests/agents/test_decode_loop.py \
    tests/marl/test_microbatches.py tests/marl/test_placement.py tests/marl/test_machine.py \
    > "$OUT/tests.txt" 2>&1; tail -8 "$OUT/tests.txt"
fi
echo "all took $((SECONDS - began)) s" | tee -a "$OUT/device.txt"
