#!/usr/bin/env bash
# Kernel-variant sweep on one H200 (bench.mla_sweep candidates, bench.indexer_sweep), then the
# GPU run of the op tests that cover the variants. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT"
timeout 120 python3 -m bench.indexer_sweep --out "$OUT/indexer_sweep.json" > "$OUT/indexer_sweep.log" 2>&1
timeout 300 python3 -m bench.mla_sweep --out "$OUT/mla_sweep.json" --only-extra --splits-scale 1 2 \
  --config 16,32,4,1,1 --config 16,32,4,1,0 --config 16,32,4,2,0 --config 16,32,8,1,1 \
  --config 16,16,4,1,1 --config 16,64,4,1,0 --config 16,64,4,2,0 --config 32,32,4,1,1 \
  --config 32,32,8,1,1 --config 32,32,4,2,0 --config 64,32,8,1,1 \
  > "$OUT/mla_sweep.log" 2>&1
timeout 150 python3 -m pytest -q -x -p no:cacheprovider --tb=short -m "not slow" \
  -k "corner or production or graph or variants or fused" \
  tests/test_torch_sparse_mla.py tests/test_torch_indexer.py > "$OUT/tests.txt" 2>&1
tail -2 "$OUT/tests.txt"; grep -c median_us "$OUT/mla_sweep.log"; grep -c logits_us "$OUT/indexer_sweep.log"
