#!/usr/bin/env bash
# Triage on a GPU machine: every test module in parallel, first failures of each with short
# tracebacks, one combined log under $OUT. Usage: scripts/gpu_triage.sh [maxfail] [timeout_s]
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT/t"
MAXFAIL=${1:-4}; TMO=${2:-240}; shift 2 2>/dev/null
FILES=${*:-tests/test_*.py}
for f in $FILES; do
  n=$(basename "$f" .py)
  timeout "$TMO" python3 -m pytest -q -p no:cacheprovider -m "not slow" --maxfail="$MAXFAIL" --tb=short "$f" \
    > "$OUT/t/$n.log" 2>&1 &
done
wait
for f in "$OUT"/t/*.log; do
  echo "##### $(basename "$f")"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$f" | tail -8
done > "$OUT/summary.txt"
for f in "$OUT"/t/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/triage.log"
rm -rf "$OUT/t"
cat "$OUT/summary.txt"
