#!/usr/bin/env bash
# One H200 call for the indexer (issue 17), < 4 min: the logits / top-k variant sweep at the four
# shapes (bench.indexer_sweep: JSON $OUT/sweep_idx.json), the indexer --targets rows with topk_us
# (triton and pallas; JSON under $OUT), and the torch indexer / top-k tests on the GPU. Run from
# the repo root:
#
#   OUT=$OUT PYTHONPATH=. scripts/idx_gpu.sh
#
# Step limits (s) are gpu_run.sh's; the bench stops starting new shapes 40 s before its limit.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-.}
BENCH_PATHS=${BENCH_PATHS:-"triton pallas"} BENCH_OPS=indexer_topk \
  exec scripts/gpu_run.sh sweep:idx:90 bench:targets:105 tests:idxt:45
