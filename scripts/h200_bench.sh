#!/usr/bin/env bash
# Timing call on one H200: indexer and sparse-MLA sweeps at the headline shapes, then
# bench --quick with the dispatch table. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT/bench"
timeout 90 python3 -m bench.indexer_sweep --out "$OUT/indexer_sweep.json" > "$OUT/sweeps.log" 2>&1
timeout 120 python3 -m bench.mla_sweep --out "$OUT/mla_sweep.json" >> "$OUT/sweeps.log" 2>&1
timeout ${T_BENCH:-340} python3 -m bench --quick --budget-s ${BUDGET:-260} --write-dispatch --no-progress \
  --no-plot --out "$OUT/bench" --dispatch-dir "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
grep -c median_us "$OUT/sweeps.log"; tail -45 "$OUT/bench.log"
