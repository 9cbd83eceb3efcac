#!/usr/bin/env bash
# One GPU call: the steps named as arguments, in order, each under its own time limit, results
# and logs under $OUT (the device tool's output folder; default ./out). Run it from the repo root:
#
#   scripts/gpu_run.sh bench:targets:330 tests:layer:120 sweep:mla:120
#
# Steps (NAME:WHAT:SECONDS):
#   bench:targets   python -m bench --targets, then bench.targets on its JSON ($OUT/targets_status.*:
#                   every issue target met / missed) (BENCH_PATHS, default "triton pallas"; BENCH_OPS, default
#                   all ops, e.g. "indexer_topk"; BENCH_BACKENDS, default both; BENCH_PRESETS, default
#                   both, e.g. "DSV4_FLASH"), JSON + log. The jax
#                   layer rows' phases need a process in which torch.profiler has not run (CUPTI
#                   takes one subscriber): BENCH_BACKENDS=jax in a second invocation; BENCH_HLO_DIR=$OUT/hlo
#                   also writes each jax layer row's optimised HLO there; XLA_FLAGS set for the
#                   call are recorded in the JSON's "env"; with TF_CPP_MIN_LOG_LEVEL=0
#                   TF_CPP_VMODULE=command_buffer_conversion_pass=2 also $OUT/xla_cmdbuf.{txt,json}: what
#                   XLA put into its command buffers, per module (bench.xla_cmdbuf on the log)
#   bench:quick     python -m bench --quick --write-dispatch (dispatch table under $OUT)
#   tests:FILES     pytest on the GPU; WHAT is one of the groups below or a test file
#   sweep:mla|idx   bench.mla_sweep / bench.indexer_sweep (variants of the Triton kernels)
#   sweep:mlasmall  bench.mla_sweep --small-heads: the occupancy-first small-head tiles (bench/NOTES.md
#                   "Small heads") on the V3.2 H16, V4 H8 and V4 H64 rows against the binding's own
#                   choice; checked against the reference, CUDA-graph timed over rotated input sets,
#                   each shape's variants in a child process (SWEEP_VARIANT_TIMEOUT s a variant,
#                   default 90; a faulting variant is a row), JSON $OUT/sweep_mlasmall.json
#                   (MLA_SWEEP_ARGS: e.g. "--shapes v4_h8 --variants gluon_sh_h8w4")
#   sweep:mlahint   bench.mla_sweep --targets --l2-hint: every fp8 sparse-MLA target row, the binding's
#                   choice as committed, then with the Gluon producers' L2 hint off and on, as the
#                   bench times them (MLA_SWEEP_ARGS: e.g. "--heads 8 16"), JSON $OUT/sweep_mlahint.json
#   sweep:pallasmla bench.pallas_mla_sweep: every Pallas sparse-MLA config at the fp8 target rows,
#                   checked and timed with the bench's JAX timer (PALLAS_SWEEP_ARGS: e.g. "--rows
#                   v32_b16_n1_h128 --scales 1,2"), JSON $OUT/sweep_pallasmla.json
#   sweep:idxws     bench.indexer_sweep --ws: the warp-specialised logits kernel's variants against
#                   today's Gluon kernel (checks + logits timed alone; SWEEP_ROW_TIMEOUT per row;
#                   IDX_SWEEP_ARGS replaces --ws, e.g. "--isolate --shape v32_b64_n2_l64k
#                   --variant gluon --variant gluon_ws")
#   check:NAME      bench.gluon_check --kernels CHECK_KERNELS (default the latent WS pair), each
#                   kernel in a child under WS_TIMEOUT s, JSON $OUT/gluon_check_NAME.json
#                   (CHECK_STRESS=N: each Gluon config launched N times more at every timing
#                   shape, results compared bitwise with the first: a race or a hang)
#   sweep:prep      bench.prep_sweep: the layer's fused prep kernels alone (both presets, B 1 / 64) and
#                   prep_q at each launch shape of its CANDIDATES (and its index / mla halves), JSON
#                   $OUT/sweep_prep.json
#   sweep:linear    bench.linear_sweep: every layer projection GEMM (both presets, B 1 / 64), torch's
#                   GEMMs against the Triton few-token GEMM's configs and split counts, CUDA-graph
#                   timed (LINEAR_SWEEP_ARGS: extra flags, e.g. "--preset DSV32" or "--heuristic-only")
#   ncumla:KERNEL   Nsight Compute on one sparse-MLA Gluon kernel of bench.gluon_check (e.g.
#                   ncumla:gluon_xs:120; a variant such as gluon_xs_nopf profiles its kernel) alone,
#                   python -m bench.ncu_mla (B 64 H 128 fp8_ds_mla; NCU_MLA_ARGS: e.g. "--B 128",
#                   "--block-table": the targets bench's inputs), report, details page, SASS stall samples
#   parity:full     python -m parity --full --jobs 6 --budget-s SECONDS-45 (JSON report of the cases
#                   that finished, the rest under not_run; PARITY_JOBS, PARITY_ARGS: e.g.
#                   "--op sparse_mla_decode,dsa_decode_layer")
#   profile:OP      scripts/profile_kernels.py --op OP: per-kernel GPU time of the torch rows of
#                   OP in the targets grid (PROFILE_K: a label substring, or profile:OP:SECS:LABEL
#                   for this step alone; PROFILE_ARGS: extra flags, e.g. "--timeline": one call's
#                   kernels by stream and how long two ran at once), JSON + log
#   ncu:OP          Nsight Compute on one kernel (NCU_KERNEL: name regex, required) of the torch rows
#                   of OP (PROFILE_K: a label substring): --set full report $OUT/ncu_OP.ncu-rep, its
#                   details page as text and its SASS source page (per-instruction stall samples)
#                   as CSV (NCU_SKIP launches skipped first, default 3). ncu:OP:SECS:REGEX:LABEL
#                   names the kernel and the label in the step itself (several ncu steps a call)
#   sanitize:torch  compute-sanitizer memcheck over scripts/sanitize_ops.py (Triton kernels, compat
#                   API; torch's caching allocator off so every tensor is its own allocation)
#   sanitize:jax    the same for the Pallas kernels (XLA's platform allocator, no command buffers)
#   sanitize:all    both, as two invocations (two logs); a memcheck error or a FAIL line: rc != 0
#                   (SANITIZE_ARGS: extra flags, e.g. "-k idx_long -k compat_select": those cases)
#   picks:picks     scripts/apply_picks.py on this call's sweep_mlasmall / sweep_idxws JSON (else an
#                   earlier call's on this machine, kept in /tmp/dsa_state): sets the switches the
#                   sweeps support (and the sm_90 dispatch entries) in the device's copy of the
#                   tree, for the steps after it
# The last lines printed are a one-line summary per step (the device tool returns the tail).
# At the end everything under $OUT but summary.txt is packed into $OUT/out.tgz (out.2.tgz, ... when
# an earlier invocation of this call packed there; the device tool
# brings back a few files only: on 2026-12-05 a call's sweep JSONs were left out); GPU_RUN_TAR=0
# leaves the files as they are.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"
BENCH_PATHS=${BENCH_PATHS:-"triton pallas"}
BENCH_OPS=${BENCH_OPS:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
declare -a SUMMARY
group() {
  case "$1" in
    layer) echo "tests/test_layer_torch.py tests/test_layer_prep.py tests/test_layer_jax.py" ;;
    mla) echo "tests/test_torch_sparse_mla.py tests/test_jax_sparse_mla.py" ;;
    idx) echo "tests/test_torch_indexer.py tests/test_torch_topk.py tests/test_jax_indexer.py" ;;
    idxt) echo "tests/test_torch_indexer.py tests/test_torch_topk.py" ;;
    ops) echo "tests/test_torch_sparse_mla.py tests/test_torch_indexer.py tests/test_torch_topk.py" ;;
    linear) echo "tests/test_linear.py" ;;
    compat) echo "tests/test_compat_flash_mla.py tests/test_compat_deep_gemm.py tests/test_compat_topk.py tests/test_compat_engines.py tests/test_sanitize_ops.py" ;;
    *) echo "$1" ;;
  esac
}
for step in "$@"; do
  IFS=: read -r kind what secs nk pk <<< "$step"
  secs=${secs:-300}
  log="$OUT/${kind}_${what//\//_}.log"
  t0=$(date +%s)
  case "$kind" in
    bench)
      paths=(); for p in $BENCH_PATHS; do paths+=(--path "$p"); done
      for o in $BENCH_OPS; do paths+=(--op "$o"); done
      for b in ${BENCH_BACKENDS:-}; do paths+=(--backend "$b"); done
      for pr in ${BENCH_PRESETS:-}; do paths+=(--preset "$pr"); done
      extra=(); [ "$what" = quick ] && extra=(--write-dispatch --dispatch-dir "$OUT")
      timeout "$secs" python3 -m bench "--$what" "${paths[@]}" "${extra[@]}" --budget-s $((secs - 40)) \
        --no-progress --no-plot --out "$OUT" > "$log" 2>&1
      rc_b=$?
      case "${TF_CPP_VMODULE:-}" in   # XLA's command buffers, from its log (bench.xla_cmdbuf)
        *command_buffer_conversion_pass*) python3 -m bench.xla_cmdbuf "$log" --json "$OUT/xla_cmdbuf.json" \
          > "$OUT/xla_cmdbuf.txt" 2>&1 ;;
      esac
      if [ "$what" = targets ]; then   # the issues' targets on what this call measured (bench.targets)
        newest=$(ls -t "$OUT"/bench_*_targets_*.json 2>/dev/null | head -1)
        [ -n "$newest" ] && python3 -m bench.targets "$newest" --json "$OUT/targets_status.json" \
          > "$OUT/targets_status.txt" 2>&1 && grep -E '^issue [0-9]+:' "$OUT/targets_status.txt" >> "$log"
      fi
      (exit $rc_b) ;;
    picks)
      # scripts/apply_picks.py on this call's sweeps or an earlier call's on the same machine
      # (/tmp/dsa_state), so a bench later in the call or in the next call measures the picks
      d=/tmp/dsa_state; [ -f "$OUT/sweep_mlasmall.json" ] || [ -f "$OUT/sweep_idxws.json" ] && d="$OUT"
      a=(); [ -f "$d/sweep_mlasmall.json" ] && a+=(--mla "$d/sweep_mlasmall.json")
      [ -f "$d/sweep_idxws.json" ] && a+=(--idx "$d/sweep_idxws.json" --idx bench/results/indexer_sweep_ws_h200_20261205b.json --idx bench/results/indexer_sweep_ws_h200_20261205c.json)
      timeout "$secs" python3 scripts/apply_picks.py "${a[@]}" --dispatch kernels/dispatch/sm_90.json > "$log" 2>&1 && cat "$log" ;;
    tests)
      timeout "$secs" python3 -m pytest -v -rfE -p no:cacheprovider --tb=short --durations=15 -m "not slow" \
        $(group "$what") ${PYTEST_K:+-k "$PYTEST_K"} > "$log" 2>&1 ;;
    sweep)
      if [ "$what" = linear ]; then
        timeout "$secs" python3 -m bench.linear_sweep --out "$OUT/sweep_linear.json" \
          --budget-s $((secs - 60)) ${LINEAR_SWEEP_ARGS:-} > "$log" 2>&1
      elif [ "$what" = prep ]; then
        timeout "$secs" python3 -m bench.prep_sweep --out "$OUT/sweep_prep.json" > "$log" 2>&1
      elif [ "$what" = mlasmall ]; then
        timeout "$secs" python3 -m bench.mla_sweep --small-heads --budget-s $((secs - 40)) \
          --variant-timeout "${SWEEP_VARIANT_TIMEOUT:-90}" ${MLA_SWEEP_ARGS:-} \
          --out "$OUT/sweep_mlasmall.json" > "$log" 2>&1
      elif [ "$what" = mlahint ]; then
        timeout "$secs" python3 -m bench.mla_sweep --targets --l2-hint --budget-s $((secs - 40)) \
          --variant-timeout "${SWEEP_VARIANT_TIMEOUT:-90}" ${MLA_SWEEP_ARGS:-} \
          --out "$OUT/sweep_mlahint.json" > "$log" 2>&1
      elif [ "$what" = pallasmla ]; then
        timeout "$secs" python3 -m bench.pallas_mla_sweep --budget-s $((secs - 60)) ${PALLAS_SWEEP_ARGS:-} \
          --out "$OUT/sweep_pallasmla.json" > "$log" 2>&1
      elif [ "$what" = idxws ]; then
        timeout "$secs" python3 -m bench.indexer_sweep ${IDX_SWEEP_ARGS:---ws} \
          --row-timeout "${SWEEP_ROW_TIMEOUT:-60}" --out "$OUT/sweep_idxws.json" > "$log" 2>&1
      else
        mod=$([ "$what" = idx ] && echo indexer_sweep || echo mla_sweep)
        timeout "$secs" python3 -m "bench.$mod" --out "$OUT/sweep_$what.json" > "$log" 2>&1
      fi ;;
    check)
      # the warp-specialised latent kernel (kernels/sparse_mla/gluon_ws.py, KV_FORMAT 0): every
      # kernel variant in a child under WS_TIMEOUT (a hung mbarrier protocol costs that, not the call)
      timeout "$secs" python3 -m bench.gluon_check --kernels "${CHECK_KERNELS:-gluon_ws_latent,gluon_ws_latent_safe}" \
        --ws-timeout "${WS_TIMEOUT:-80}" ${CHECK_STRESS:+--stress "$CHECK_STRESS"} \
        --out "$OUT/gluon_check_$what.json" > "$log" 2>&1 ;;
    profile)
      pk=${nk:-${PROFILE_K:-}}     # profile:OP:SECS:LABEL names the label in the step itself
      timeout "$secs" python3 scripts/profile_kernels.py --op "$what" ${pk:+-k "$pk"} \
        ${PROFILE_ARGS:-} --out "$OUT/profile_$what.json" > "$log" 2>&1 ;;
    ncu)
      nk=${nk:-${NCU_KERNEL:?NCU_KERNEL}}; pk=${pk:-${PROFILE_K:-}}
      rep="$OUT/ncu_${what}_${nk//[^A-Za-z0-9_]/}"
      timeout "$secs" ncu --set full --import-source yes --kernel-name "regex:$nk" \
          --launch-skip "${NCU_SKIP:-3}" --launch-count 1 -f -o "$rep" \
        python3 scripts/profile_kernels.py --op "$what" ${pk:+-k "$pk"} --plain --reps 3 \
          > "$log" 2>&1 \
        && ncu -i "$rep.ncu-rep" --page details > "$rep.txt" 2>&1 \
        && ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 ;;
    ncumla)
      # one sparse-MLA Gluon kernel (WHAT: a bench.gluon_check kernel, e.g. gluon_xs) alone at
      # B 64 H 128 fp8_ds_mla under Nsight Compute (bench.ncu_mla; its third launch), with the
      # details page and the SASS stall samples as in ncu:OP
      rep="$OUT/ncu_mla_$what"
      # the kernel a variant runs (gluon_xs_nopf runs gluon_xs), for ncu's name filter
      kre=$(python3 -c "from bench import gluon_check as g; print(g.KERNEL_CONFIGS['$what'][0].kernel)" 2>/dev/null || echo "$what")
      timeout "$secs" ncu --set full --import-source yes --kernel-name "regex:$kre" \
          --launch-skip 2 --launch-count 1 -f -o "$rep" \
        python3 -m bench.ncu_mla --kernel "$what" ${NCU_MLA_ARGS:-} > "$log" 2>&1 \
        && ncu -i "$rep.ncu-rep" --page details > "$rep.txt" 2>&1 \
        && ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 ;;
    parity)
      # --budget-s: the report and JSON of the cases that finished, written before the step's
      # limit (a line per finished case in the log as they end)
      timeout "$secs" python3 -m parity "--$what" --jobs "${PARITY_JOBS:-6}" ${PARITY_ARGS:-} \
        --budget-s $(( secs > 90 ? secs - 45 : (secs > 1 ? secs / 2 : 1) )) --json "$OUT/parity_$what.json" > "$log" 2>&1 ;;
    sanitize)
      stacks=$([ "$what" = all ] && echo "torch jax" || echo "$what")
      rc_s=0; : > "$log"
      for st in $stacks; do
        slog="$OUT/sanitize_$st.log"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 XLA_PYTHON_CLIENT_ALLOCATOR=platform \
        XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" \
        timeout "$secs" compute-sanitizer --tool memcheck --target-processes all \
          --error-exitcode 3 --print-limit 50 \
          python3 scripts/sanitize_ops.py --stack "$st" ${SANITIZE_ARGS:-} > "$slog" 2>&1 || rc_s=$?
        grep -E '^(PASS|FAIL|SKIP) |sanitize_ops|ERROR SUMMARY' "$slog" >> "$log"
      done
      (exit $rc_s) ;;
    *) echo "unknown step $step" > "$log"; false ;;
  esac
  rc=$?
  SUMMARY+=("$step rc=$rc $(( $(date +%s) - t0 ))s: $(grep -E 'passed|failed|ERROR SUMMARY|rows failed|json:|^== |^issue [0-9]+:' "$log" | tail -4 | tr '\n' ' ')")
done
printf '%s\n' "${SUMMARY[@]}" | tee -a "$OUT/summary.txt"
mkdir -p /tmp/dsa_state && cp "$OUT"/sweep_*.json /tmp/dsa_state/ 2>/dev/null   # for a later call's picks step
if [ "${GPU_RUN_TAR:-1}" != 0 ]; then
  # a second invocation into the same $OUT packs into out.2.tgz, ... (on 2026-12-05 the second
  # of two invocations in one call overwrote the first's out.tgz and its bench JSON was lost)
  tgz=out.tgz; n=2
  while [ -e "$OUT/$tgz" ]; do tgz=out.$n.tgz; n=$((n + 1)); done
  (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name 'out*.tgz' -print0 \
     | tar czf "$tgz" --null -T - --remove-files)
fi
