#!/usr/bin/env bash
# The closing GPU call of a session (2 x H200): config sweep of the Triton sparse MLA kernel,
# bench --quick with the dispatch table, the TP=2 step bench, parity --quick. One log, $OUT/run.log.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT/bench"; LOG="$OUT/run.log"
stage() { echo "=== $1 $(date -u +%T)" | tee -a "$LOG"; }
stage sweep; timeout 60 python3 -m bench.mla_sweep --out "$OUT/mla_sweep.json" >> "$LOG" 2>&1; echo "sweep rc=$?" | tee -a "$LOG"
stage bench; timeout 200 python3 -m bench --quick --budget-s 140 --write-dispatch --no-progress --no-plot \
  --out "$OUT/bench" --dispatch-dir "$OUT/bench" >> "$LOG" 2>&1; echo "bench rc=$?" | tee -a "$LOG"
stage tp; timeout 150 python3 bench/tp_bench.py --out "$OUT/tp.json" --budget-s 45 >> "$LOG" 2>&1; echo "tp rc=$?" | tee -a "$LOG"
stage parity; timeout 100 python3 -m parity --quick --no-progress --json "$OUT/parity.json" >> "$LOG" 2>&1; echo "parity rc=$?" | tee -a "$LOG"
grep -E "median_us|frac|rc=|^=== |passed|failed|summary|ratio" "$LOG" | grep -v "cuda_event\|Source Location" | tail -60
