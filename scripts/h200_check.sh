#!/usr/bin/env bash
# Correctness call on one H200 (no timings): parity --full in worker processes, beside it the GPU
# runs of the op and layer test files. Results under $OUT: parity_h200_full.json / .log, tests_*.log.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT"
T=${T:-540}
(timeout $T python3 -m parity --full --jobs ${JOBS:-6} --no-progress --json "$OUT/parity_h200_full.json" \
   > "$OUT/parity_h200_full.log" 2>&1; echo "parity rc=$?" >> "$OUT/parity_h200_full.log") &
t() { n=$1; shift; (timeout $((T - 20)) python3 -m pytest -q -p no:cacheprovider --tb=short -m "not slow" "$@" \
       > "$OUT/tests_$n.log" 2>&1) & }
t idx tests/test_torch_indexer.py tests/test_torch_topk.py
t jidx tests/test_jax_indexer.py
t mla tests/test_torch_sparse_mla.py -k "corner or production or graph or compile or every_config"
t jmla tests/test_jax_sparse_mla.py
t step tests/test_layer_torch.py tests/test_bench.py tests/test_dispatch.py
wait
for f in "$OUT"/tests_*.log; do echo "## $f"; grep -E "passed|failed|^FAILED|^ERROR" "$f" | tail -6; done
tail -5 "$OUT/parity_h200_full.log"
