#!/usr/bin/env bash
# Diagnosis run on one H200: per-kernel time breakdown, Nsight Compute sections of the hot
# kernels, beside them the GPU-only tests of the op files and the test files named as arguments.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/diag.txt"
timeout 150 python3 -m bench.profile_ops >> "$OUT/diag.txt" 2>&1
echo "== ncu" >> "$OUT/diag.txt"
# GPU tests run beside ncu (ncu replays each profiled kernel alone; its durations may still be
# perturbed, its stall and occupancy sections are what this run is for).
if [ $# -gt 0 ]; then
  (timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -m "not slow" \
     -k "compile or graph or gpu" tests/test_torch_sparse_mla.py tests/test_torch_indexer.py \
     > "$OUT/tests_ops.txt" 2>&1) &
  (timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -m "not slow" "$@" \
     > "$OUT/tests_layer.txt" 2>&1) &
fi
for op in indexer mla; do skip=$([ $op = indexer ] && echo 6 || echo 3)
timeout 150 ncu --clock-control none --target-processes all \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis \
  -k regex:"_sparse_mla_split|_indexer_logits|_radix" --launch-skip $skip --launch-count 6 \
  python3 -m bench.profile_ops --once --ops $op > "$OUT/ncu_$op.txt" 2>&1; done
echo "ncu rc=$?" >> "$OUT/diag.txt"
wait
tail -3 "$OUT"/tests_*.txt
