#!/usr/bin/env bash
# One device call on a lent H200 (or any CUDA machine with torch/triton/jax preinstalled):
# environment report, GPU test suite, parity --full, bench --quick with the dispatch table,
# and (on two GPUs) the TP=2 step bench. Results go under $OUT (default ./out).
# Usage: scripts/h200_run.sh [env] [tests] [parity] [bench] [tp]   (default: all but tp)
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PY:-python3}
stages=${*:-env tests parity bench}
T_TESTS=${T_TESTS:-200} T_PARITY=${T_PARITY:-150} T_BENCH=${T_BENCH:-260} T_TP=${T_TP:-200}
for s in $stages; do
  echo "=== $s $(date -u +%T)"
  case $s in
    env)    { nvidia-smi; $PY -m parity --env; } > "$OUT/env.txt" 2>&1; tail -25 "$OUT/env.txt" ;;
    tests)  timeout $T_TESTS $PY -m pytest -q -p no:cacheprovider --timeout 120 -m "not slow" tests \
              > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest.log" | tail -40 ;;
    parity) timeout $T_PARITY $PY -m parity --full --no-progress --json "$OUT/parity.json" > "$OUT/parity.log" 2>&1;
            echo "parity rc=$?"; tail -40 "$OUT/parity.log" ;;
    bench)  timeout $T_BENCH $PY -m bench --quick --write-dispatch --out "$OUT/bench" --dispatch-dir "$OUT/bench" \
              > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; tail -60 "$OUT/bench.log" ;;
    tp)     timeout $T_TP $PY bench/tp_bench.py --out "$OUT/tp.json" > "$OUT/tp.log" 2>&1; echo "tp rc=$?"; tail -30 "$OUT/tp.log" ;;
  esac
done
