"""python -m bench plumbing: floor formulas against hand-computed numbers, the dry run's rows, JSON,
PNG and dispatch table (and its round trip through kernels.dispatch.lookup), check-before-time
(a wrong path is reported and never timed), and the real op paths on one tiny shape.

The plumbing tests use stub backends (kernels.reference behind the torch/jax adapter interface)
so they do not depend on the op modules; ``test_dry_run_real_paths`` runs whatever paths import.
"""
import io
import json
import os
import time
from pathlib import Path

import ml_dtypes
import numpy as np

import pytest

from bench import grid, paths, report, roofline
from bench.runner import RunConfig, run
from kernels import dispatch, reference

# ----------------------------------------------------------------------------- floor math


def test_mla_cost_fp8_ds_mla_by_hand():
    # V3.2, B=64, N=1, H=128, K=2048 all valid, bf16 q/out:
    # rows 64*2048 = 131072 x 656 B = 85,983,232; q 64*128*576*2 = 9,437,184; out 64*128*512*2 = 8,388,608
    nbytes, flops = roofline.mla_cost(B=64, N=1, H=128, n_valid=64 * 2048, d_qk=576, d_v=512,
                                      kv_format="fp8_ds_mla", q_itemsize=2)
    assert nbytes == 85_983_232 + 9_437_184 + 8_388_608 == 103_809_024
    assert flops == 2 * 128 * 131072 * (576 + 512) == 36_507_222_016


def test_mla_cost_model1_and_latent_by_hand():
    # V4-Flash, B=64, H=64, K=512+128 window: rows 40960 x 584 = 23,920,640; q and out 64*64*512*2 each
    nbytes, flops = roofline.mla_cost(B=64, N=1, H=64, n_valid=64 * 640, d_qk=512, d_v=512,
                                      kv_format="fp8_model1", q_itemsize=2)
    assert nbytes == 23_920_640 + 2 * 4_194_304 == 32_309_248
    assert flops == 2 * 64 * 40960 * 1024 == 5_368_709_120
    # bf16 latent rows are 2 * D_qk bytes; N=2 doubles rows, q and out
    nbytes, _ = roofline.mla_cost(B=1, N=2, H=16, n_valid=2 * 2048, d_qk=576, d_v=512,
                                  kv_format="latent", kv_itemsize=2, q_itemsize=2)
    assert nbytes == 4096 * 1152 + 2 * 16 * 576 * 2 + 2 * 16 * 512 * 2 == 4_788_224
    assert roofline.kv_row_bytes("fp8_ds_mla", 576) == 656
    assert roofline.kv_row_bytes("fp8_model1", 512) == 584
    assert roofline.kv_row_bytes("latent", 576, 2) == 1152
    with pytest.raises(ValueError, match="kv_format"):
        roofline.kv_row_bytes("fp4", 576)


def test_indexer_cost_and_floor_by_hand():
    # B=64, L=64K (the indexer target shape): 64*65536*132 = 553,648,128 B of cache,
    # q 64*64*128 = 524,288 (e4m3), weights 64*64*4 = 16,384
    nbytes, flops = roofline.indexer_cost(lens=[65536] * 64, N=1, H_I=64, D_I=128)
    assert nbytes == 553_648_128 + 524_288 + 16_384 == 554_188_800
    assert flops == 2 * 64 * 128 * 64 * 65536 == 68_719_476_736
    m = roofline.Machine(4.3e12, 7.9e14, "nominal H200", measured=False)
    # memory-bound: 554,188,800 / 4.3e12 s = 128.88 us > 68.7e9 / 7.9e14 s = 86.99 us
    assert m.floor_us(nbytes, flops) == pytest.approx(128.8811, rel=1e-5)
    met = roofline.row_metrics(m, nbytes, flops, 200.0)
    assert met["frac_floor"] == pytest.approx(128.8811 / 200.0, rel=1e-5)
    assert met["GB_per_s"] == pytest.approx(554_188_800 / 200e-6 / 1e9)
    assert met["TFLOP_per_s"] == pytest.approx(68_719_476_736 / 200e-6 / 1e12)
    # compute-bound: the V3.2 MLA shape above at H=128
    mla_b, mla_f = 103_809_024, 36_507_222_016
    assert m.floor_us(mla_b, mla_f) == pytest.approx(max(mla_b / 4.3e12, mla_f / 7.9e14) * 1e6)
    assert m.floor_us(mla_b, mla_f) == pytest.approx(46.21, rel=1e-3)


def test_layer_cost_by_hand():
    """The decode layer at the real dimensions: this rank's weights once (bf16 linear, float32
    norms / sink / indexer.weights_proj) + the indexer + sparse MLA bytes; every projection's
    2 * tokens * numel + the Hadamard rotations + the attention FLOPs."""
    from kernels import layer_reference as lref
    # V3.2, B=64, N=1, L=32K, fp8_ds_mla. bf16 weights: wq_a 1536*7168 = 11,010,048, wq_b
    # 24576*1536 = 37,748,736, wkv_a 576*7168 = 4,128,768, wkv_b 32768*512 = 16,777,216,
    # wo 7168*16384 = 117,440,512, indexer.wq_b 8192*1536 = 12,582,912, indexer.wk 128*7168 =
    # 917,504: 200,605,696 x 2 B; float32: q_norm 1536 + kv_norm 512 + k_norm 2*128 +
    # weights_proj 64*7168 = 458,752: 461,056 x 4 B
    w_bytes = 200_605_696 * 2 + 461_056 * 4
    assert w_bytes == 403_055_616 == roofline.layer_weight_bytes(lref.DSV32_LAYER)
    idx_b = 64 * 32768 * 132 + 64 * 64 * 128 + 64 * 64 * 4                 # 277,364,736
    mla_b = 64 * 2048 * 656 + 64 * 128 * 576 * 2 + 64 * 128 * 512 * 2       # 103,809,024
    proj_f = 2 * 64 * (200_605_696 + 458_752) + 2 * 64 * 65 * 128 * 128     # projections + Hadamard
    idx_f = 2 * 64 * 128 * 64 * 32768
    mla_f = 2 * 128 * (64 * 2048) * (576 + 512)
    parts = []
    nbytes, flops = roofline.layer_cost(lref.DSV32_LAYER, B=64, N=1, lens=[32768] * 64,
                                        kv_format="fp8_ds_mla", parts=parts)
    assert nbytes == w_bytes + idx_b + mla_b == 784_229_376
    assert flops == proj_f + idx_f + mla_f == 96_739_524_608
    assert parts == [(w_bytes, proj_f), (idx_b, idx_f), (mla_b, mla_f)]
    m = roofline.Machine(4.3e12, 7.9e14, "nominal H200", measured=False)
    assert m.floor_us(nbytes, flops) == pytest.approx(784_229_376 / 4.3e12 * 1e6)      # 182.4 us, memory
    # V4-Flash, B=1, L=32K, fp8_model1: the indexer ranks L - 128 positions, the MLA reads
    # 512 top-k + 128 window rows. bf16 weights: wq_a 1024*4096 = 4,194,304, wq_b 32768*1024 =
    # 33,554,432, wkv 512*4096 = 2,097,152, wo_a 8192*4096 = 33,554,432, wo_b 4096*8192 =
    # 33,554,432, indexer.wq_b 8192*1024 = 8,388,608, indexer.wk 128*4096 = 524,288:
    # 115,867,648; float32: q_norm 1024 + kv_norm 512 + attn_sink 64 + k_norm 256 + weights_proj
    # 64*4096 = 262,144: 264,000
    w4 = 115_867_648 * 2 + 264_000 * 4
    nbytes, flops = roofline.layer_cost(lref.DSV4_FLASH_LAYER, B=1, N=1, lens=[32768], kv_format="fp8_model1")
    assert nbytes == w4 + (32640 * 132 + 64 * 128 + 64 * 4) + (640 * 584 + 2 * 64 * 512 * 2) == 237_613_056
    assert flops == (2 * (115_867_648 + 262_144) + 2 * 65 * 128 * 128 + 2 * 64 * 128 * 32640
                     + 2 * 64 * 640 * 1024) == 853_049_344
    # TP = 2: heads, wq_b / wkv_b rows and wo columns halve; the replicated rest does not
    halved = 37_748_736 + 16_777_216 + 117_440_512      # wq_b, wkv_b, wo: half their numel x 2 B
    assert roofline.layer_weight_bytes(lref.DSV32_LAYER, tp=2) == w_bytes - halved
    with pytest.raises(ValueError, match="tp_size"):
        roofline.layer_weight_bytes(lref.DSV32_LAYER, tp=3)


def test_rotations_cover_twice_l2():
    from bench.inputs import L2_BYTES, rotations_for
    assert rotations_for(10 * L2_BYTES, 20 * L2_BYTES, max_bytes=1 << 40) == 1
    assert rotations_for(L2_BYTES // 4, L2_BYTES, max_bytes=1 << 40) == 8
    assert rotations_for(1, 1, max_bytes=1 << 40) == 32                     # capped
    assert rotations_for(L2_BYTES // 4, 1 << 30, max_bytes=3 << 30) == 3    # memory-capped


def test_grid_shapes_follow_presets():
    full = grid.full_grid()
    mla = [s for s in full if s.op == "sparse_mla_decode"]
    assert {s.B for s in mla} == {1, 8, 32, 64, 128}
    assert {s.H for s in mla if s.preset == "DSV32"} == {128, 64, 32, 16}
    assert {s.H for s in mla if s.preset == "DSV4_FLASH"} == {64, 32, 16, 8}
    assert {s.L for s in mla if s.preset == "DSV4_FLASH"} == {4096, 32768, 131072, 1 << 20}
    assert {s.L for s in mla if s.preset == "DSV32"} == {4096, 32768, 131072}
    assert {s.kv_format for s in mla} == {"latent", "fp8_ds_mla", "fp8_model1"}
    v4 = next(s for s in mla if s.preset == "DSV4_FLASH")
    assert v4.K == 512 + 128 and v4.kv_format in ("latent", "fp8_model1")
    quick = grid.quick_grid()
    assert len(quick) < 40 and {s.op for s in quick} == set(grid.OPS)
    layer = [s for s in quick if s.op == "dsa_decode_layer"]
    assert {(s.preset, s.B) for s in layer} == {(p, b) for p in ("DSV32", "DSV4_FLASH") for b in (1, 64)}
    assert {s.L for s in layer} == {32768} and {s.kv_format for s in layer} == {"fp8_ds_mla", "fp8_model1"}
    assert {(s.layer_cfg.hidden, s.H, s.K) for s in layer} == {(7168, 128, 2048), (4096, 64, 640)}
    assert set(layer) <= set(full)
    dry = [s for s in grid.dry_grid() if s.op == "dsa_decode_layer"]
    assert {s.preset for s in dry} == {"DSV32", "DSV4_FLASH"} and {s.layer_cfg.hidden for s in dry} == {256}


# ----------------------------------------------------------------------------- stub backends

def _np(t):
    from bench.inputs import to_numpy_exact
    return None if t is None else to_numpy_exact(t)


def _ref_outputs(op, inp, s, perturb=False):
    import torch
    sh = inp.shape
    out = {}
    if op == "dsa_decode_layer":
        from kernels import layer_reference as lref
        ref = lref.layer_reference(sh.layer_cfg, inp.extra["layer_weights"], _np(s["x"]).astype(np.float32),
                                   _np(s["kv_cache"]), _np(s["k_cache"]), _np(s["block_table"]),
                                   _np(s["context_lens"]), kv_format=sh.kv_format)
        o = ref.out * (1.1 if perturb else 1.0)
        return {"out": torch.as_tensor(o.astype(np.float32)), "kv_cache": torch.as_tensor(ref.kv_cache),
                "k_cache": torch.as_tensor(ref.k_cache), "indices": torch.as_tensor(ref.indices),
                "idx_q": torch.as_tensor(ref.idx_q.view(np.uint8)).view(torch.float8_e4m3fn),
                "idx_weights": torch.as_tensor(ref.idx_weights),
                "idx_context_lens": torch.as_tensor(ref.idx_context_lens)}
    if op in ("indexer_topk", "dsa_decode_step"):
        lens = _np(s["context_lens"])
        if op == "dsa_decode_step" and sh.W_window:      # dsa_decode_step(window=): before the window
            lens = np.maximum(reference.valid_lengths(lens, sh.B, sh.N) - sh.W_window, 0).astype(np.int32)
        idx = reference.indexer_topk(_np(s["iq"]), _np(s["iw"]), _np(s["k_cache"]), _np(s["block_table"]),
                                     lens, sh.K_topk)
        if perturb:
            idx = idx.copy()
            idx[..., 0] = idx[..., -1] + 1 if idx.shape[-1] > 1 else 0   # drop the best position
        if sh.W_window:
            idx = np.concatenate([idx, _np(s["window_idx"])], axis=-1)
        out["indices"] = torch.as_tensor(idx)
    if op in ("sparse_mla_decode", "dsa_decode_step"):
        idx = _np(s["indices"]) if op == "sparse_mla_decode" else out["indices"].numpy()
        o, lse = reference.sparse_mla_decode(_np(s["q"]), _np(s["kv_cache"]), idx, inp.sm_scale,
                                             kv_format=sh.kv_format, d_v=sh.p.d_v,
                                             block_table=_np(s["block_table"]), attn_sink=_np(s["attn_sink"]))
        if perturb:
            o = o * 1.1
        out["out"], out["lse"] = torch.as_tensor(o.astype(np.float32)), torch.as_tensor(lse.astype(np.float32))
    return out


class StubBackend(paths.Backend):
    """kernels.reference behind the adapter interface; ``broken`` paths perturb their outputs,
    ``slow`` paths sleep, so the winner and the failure are known in advance."""

    def __init__(self, name, path_names, broken=(), slow=()):
        self.name, self.paths, self.broken, self.slow = name, tuple(path_names), broken, slow

    def load(self):
        return self

    def prepare(self, op, inp, path):
        def call(s):
            t0 = time.perf_counter()
            out = _ref_outputs(op, inp, s, perturb=path in self.broken)
            if path in self.slow:
                # 0.1 s plus three times this call's own reference work: slower than the fast
                # path however loaded the machine (a fixed 0.1 s lost to ~20-50 ms of work
                # stretched by other test processes, 2026-12-07)
                time.sleep(0.1 + 3 * (time.perf_counter() - t0))
            return out
        return [lambda s=s: call(s) for s in inp.sets]

    def config(self, op, inp, path):
        return {"block_h": 16, "stub": path} if path in ("triton", "pallas") else None


@pytest.fixture
def stub_registry(monkeypatch):
    reg = {"torch": StubBackend("torch", ("triton", "torch"), slow=("torch",)),
           "jax": StubBackend("jax", ("pallas", "xla"), broken=("pallas",))}
    monkeypatch.setattr(paths, "REGISTRY", reg)
    return reg


def _small_shapes():
    S = grid.Shape
    return [S("sparse_mla_decode", "DSV4_FLASH", 2, 2, 8, 256, "fp8", topk=64, window=16),
            S("indexer_topk", "DSV32", 2, 1, 1, 200, topk=32, table_len=512),
            S("dsa_decode_step", "DSV32", 2, 1, 8, 256, "fp8", topk=32, window=0),
            S("dsa_decode_layer", "DSV4_FLASH", 2, 1, 1, 256, "fp8", topk=32, window=16, heads=4)]


def test_dry_run_rows_json_png_dispatch(tmp_path, stub_registry, monkeypatch):
    monkeypatch.setattr(grid, "dry_grid", _small_shapes)
    cfg = RunConfig(mode="dry", out=tmp_path, write_dispatch=True, progress=False,
                    command="python -m bench --dry-run (test)")
    res = run(cfg)
    rows = res["rows"]
    assert len(rows) == 4 * 4
    for r in rows:
        for k in report.ROW_KEYS:
            assert k in r, k
    by = {(r["op"], r["path"]): r for r in rows}
    # check before time: the broken path fails its check against the reference and is not timed
    for op in grid.OPS:
        bad = by[(op, "pallas")]
        assert bad["status"].startswith("FAILED check"), bad["status"]
        assert bad["median_us"] is None and bad["frac_floor"] is None
        for pth in ("triton", "torch", "xla"):
            r = by[(op, pth)]
            assert r["status"] == "ok", r["status"]
            assert r["check"]["passed"]
            assert r["p20_us"] <= r["median_us"] <= r["p80_us"]
            assert r["frac_floor"] == pytest.approx(r["floor_us"] / r["median_us"])
    # indexer rows carry topk_us (the stub calls open no phase ranges: 0 from the profiler on
    # the torch backend; jax dry-run rows say why they have none); other ops do not
    for pth in ("triton", "torch"):
        assert by[("indexer_topk", pth)]["topk_us"] == 0.0
        assert by[("indexer_topk", pth)]["topk_timer"].startswith("torch.profiler")
    assert by[("indexer_topk", "xla")]["topk_us"] is None
    assert "jax dry run" in by[("indexer_topk", "xla")]["topk_timer"]
    assert "topk_us" not in by[("sparse_mla_decode", "triton")]
    # bytes / FLOPs of the rows are the formulas applied to the shape
    m = by[("sparse_mla_decode", "triton")]
    assert (m["K"], m["H"], m["kv_format"]) == (80, 8, "fp8_model1")
    assert m["bytes"] == 2 * 2 * 80 * 584 + 2 * 2 * 8 * 512 * 2 * 2       # fp16 q/out in dry runs
    assert m["flops"] == 2 * 8 * (2 * 2 * 80) * 1024
    ix = by[("indexer_topk", "triton")]
    assert ix["bytes"] == 2 * 200 * 132 + 2 * 64 * 128 + 2 * 64 * 4 and ix["table_len"] == 512
    assert ix["flops"] == 2 * 64 * 128 * 400
    st = by[("dsa_decode_step", "triton")]
    assert st["bytes"] == (2 * 256 * 132 + 2 * 64 * 128 + 2 * 64 * 4) + (2 * 32 * 656 + 2 * 16 * 576 * 2 + 2 * 16 * 512 * 2)
    machine = res["meta"]["machine"]
    floor = lambda b, f: max(b / machine["copy_bytes_per_s"], f / machine["matmul_flops_per_s"]) * 1e6  # noqa: E731
    assert st["floor_us"] == pytest.approx(floor(st["bytes"], st["flops"]))
    ib, mb = 2 * 256 * 132 + 2 * 64 * 128 + 2 * 64 * 4, 2 * 32 * 656 + 2 * 16 * 576 * 2 + 2 * 16 * 512 * 2
    assert st["floor_phases_us"] == pytest.approx([floor(ib, 2 * 64 * 128 * 512),
                                                   floor(mb, 2 * 16 * 64 * (576 + 512))])
    # the scaled-down V4 layer (4 heads, hidden 256, q_lora 64, 16 indexer heads, 2 groups of
    # o_lora 32, P 64), fp16: weights wq_a 64*256 = 16,384, wq_b 2048*64 = 131,072, wkv
    # 512*256 = 131,072, wo_a 64*1024 = 65,536, wo_b 256*64 = 16,384, indexer.wq_b 2048*64 =
    # 131,072, indexer.wk 128*256 = 32,768: 524,288 x 2 B; float32: q_norm 64 + kv_norm 512 +
    # attn_sink 4 + k_norm 256 + weights_proj 16*256 = 4,096: 4,932 x 4 B
    ly = by[("dsa_decode_layer", "triton")]
    assert (ly["H"], ly["K"], ly["hidden"], ly["H_I"], ly["kv_format"]) == (4, 48, 256, 16, "fp8_model1")
    wb = 524_288 * 2 + 4_932 * 4
    lb = 2 * 240 * 132 + 2 * 16 * 128 + 2 * 16 * 4                # indexer over L - window = 240
    mb2 = 2 * 48 * 584 + 2 * 4 * 512 * 2 * 2                      # 32 top-k + 16 window rows each
    assert ly["weight_bytes"] == wb and ly["bytes"] == wb + lb + mb2 == 1_208_336
    pf = 2 * 2 * (524_288 + 4_096) + 2 * 2 * 17 * 128 * 128
    assert ly["flops"] == pf + 2 * 16 * 128 * 480 + 2 * 4 * 96 * 1024 == 5_980_160
    assert ly["floor_phases_us"] == pytest.approx([floor(wb, pf), floor(lb, 2 * 16 * 128 * 480),
                                                   floor(mb2, 2 * 4 * 96 * 1024)])
    assert "layer reference" in ly["check"]["how"]
    # JSON: SPEC "Result files" + the dry-run label
    doc = json.loads(res["json"].read_text())
    for k in ("gpu", "compute_capability", "versions", "date", "command", "rows"):
        assert k in doc
    assert doc["dry_run"] is True and "meaningless" in doc["note"]
    assert doc["command"] == "python -m bench --dry-run (test)" and len(doc["rows"]) == 16
    # the compiler flags set for the run (conftest sets XLA_FLAGS) are part of the command
    assert doc["env"] == {k: os.environ[k] for k in ("XLA_FLAGS", "TRITON_INTERPRET")
                          if os.environ.get(k)} and "XLA_FLAGS" in doc["env"]
    # PNG written
    assert res["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # dispatch: the dry run writes under <out>/dispatch, never into the package
    assert res["dispatch"] == tmp_path / "dispatch" / "interpreter.json"
    table = json.loads(res["dispatch"].read_text())
    dispatch.validate_table(table)
    ents = {(e["op"], e["backend"]): e for e in table["entries"]}
    assert set(ents) == {("sparse_mla_decode", "torch"), ("sparse_mla_decode", "jax"),
                         ("indexer_topk", "torch"), ("indexer_topk", "jax")}
    assert ents[("sparse_mla_decode", "torch")]["path"] == "triton"     # the slow stub loses
    assert ents[("sparse_mla_decode", "torch")]["config"] == {"block_h": 16, "stub": "triton"}
    assert ents[("sparse_mla_decode", "jax")]["path"] == "xla"          # the broken one is never chosen
    assert ents[("sparse_mla_decode", "jax")]["config"] == {}           # a plain path's config
    # round trip: the bucket the launchers compute finds the entry
    monkeypatch.setenv(dispatch.DISPATCH_DIR_ENV, str(tmp_path / "dispatch"))
    dispatch.clear_cache()
    b = dispatch.bucket("sparse_mla_decode", B=2, N=2, H=8, K=80, d_qk=512, kv_format="fp8_model1")
    assert dispatch.lookup("sparse_mla_decode", "torch", "interpreter", b)["path"] == "triton"
    assert dispatch.lookup("sparse_mla_decode", "jax", "interpreter", b)["path"] == "xla"
    bi = dispatch.bucket("indexer_topk", B=2, N=1, L=512, topk=32)        # L = block-table capacity
    assert dispatch.lookup("indexer_topk", "torch", "interpreter", bi)["path"] == "triton"
    assert dispatch.lookup("indexer_topk", "torch", "interpreter",
                           dispatch.bucket("indexer_topk", B=2, N=1, L=512, topk=64), nearest=False) is None


def test_cli_exit_status_and_filters(tmp_path, stub_registry, monkeypatch, capsys):
    from bench.__main__ import main
    monkeypatch.setattr(grid, "dry_grid", _small_shapes)
    rc = main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--no-plot", "--op", "sparse_mla_decode",
               "--backend", "torch"])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("bench_dry_dry_*.json")).read_text())
    assert {(r["op"], r["backend"]) for r in doc["rows"]} == {("sparse_mla_decode", "torch")}
    assert all(r["status"] == "ok" for r in doc["rows"])
    rc = main(["--dry-run", "--out", str(tmp_path / "b"), "--no-progress", "--no-plot", "--op", "indexer_topk",
               "--path", "pallas"])
    assert rc == 1                                                   # the broken path fails its check
    assert "FAILED" in capsys.readouterr().out


class _Ev:
    """A profiler event as indexer_phase_totals reads it."""

    def __init__(self, name, device_type, device_us=0.0, cpu_us=0.0):
        self.name, self.device_type = name, device_type
        self.device_time_total, self.cpu_time_total = device_us, cpu_us


def test_indexer_phase_totals_from_fake_profiler_events():
    """topk_us plumbing: on a GPU the kernels' device time by name (Triton launches are not
    attributed to the ranges there), the ranges' device time when no kernel name matches; the
    ranges' CPU time on the CPU; other ranges, ops and kernels (the fill) ignored."""
    from torch.autograd import DeviceType
    lg, tk = paths.INDEXER_PHASES["logits"], paths.INDEXER_PHASES["topk"]
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    evs = [_Ev("dsa::indexer_topk", cpu, 500.0, 90.0), _Ev(lg, cpu, 300.0, 20.0),
           _Ev(tk, cpu, 40.0, 60.0), _Ev(lg, cpu, 310.0, 21.0), _Ev(tk, cpu, 42.0, 61.0),
           _Ev("aten::clamp", cpu, 2.0, 5.0),
           _Ev("_indexer_logits_kernel", cuda, 610.0), _Ev("_topk_plan_kernel", cuda, 30.0),
           _Ev("_radix_topk_kernel", cuda, 52.0), _Ev("vectorized_elementwise_kernel", cuda, 1.0),
           _Ev("dsa::indexer_topk", cuda, 700.0), _Ev(tk, cuda, 90.0)]   # GPU-timeline annotations
    t = paths.indexer_phase_totals(evs, on_gpu=True)
    assert (t["logits"], t["topk"], t["how"]) == (610.0, 82.0, "kernel names")
    no_kernels = [e for e in evs if e.device_type != cuda or "::" in e.name]
    t = paths.indexer_phase_totals(no_kernels, on_gpu=True)
    assert (t["logits"], t["topk"], t["how"]) == (610.0, 82.0, "profiler ranges")
    t = paths.indexer_phase_totals(evs, on_gpu=False)
    assert (t["logits"], t["topk"]) == (41.0, 121.0)
    no_ranges = [e for e in evs if e.device_type == cuda]
    t = paths.indexer_phase_totals(no_ranges, on_gpu=True)
    assert (t["logits"], t["topk"], t["how"]) == (610.0, 82.0, "kernel names")


def test_layer_phase_totals_take_the_window_kernel_off_the_indexer():
    """torch layer phases: each phase op's device time where no phase op encloses it (a GEMM
    inside a DSA op is that op's), V4's window kernel launched inside
    ``dsa::indexer_topk_window`` counted as glue, not indexer (the step before it ran the window
    kernel in its own op: glue there too), the rest of the kernels glue; per call."""
    from torch.autograd import DeviceType
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    win = _Ev("dsa::indexer_topk_window", cpu, 13.0)        # its kernels: 6 + 3 + 1 + 3
    mm_in_op = _Ev("aten::mm", cpu, 3.0)
    mm_in_op.cpu_parent = win
    evs = [win, mm_in_op, _Ev("aten::mm", cpu, 90.0), _Ev("dsa::sparse_mla_decode", cpu, 15.0),
           _Ev("_indexer_logits_gluon_ws_kernel", cuda, 6.0), _Ev("_radix_topk_kernel", cuda, 3.0),
           _Ev("_window_split_kernel", cuda, 1.0), _Ev("nvjet_sm90_gemm", cuda, 3.0),
           _Ev("_gemv_kernel", cuda, 90.0),
           _Ev("_prep_q_kernel", cuda, 4.0), _Ev("_sparse_mla_gluon_kernel", cuda, 15.0)]
    for e in evs:
        e.cpu_parent = getattr(e, "cpu_parent", None)
    t = paths.layer_phase_totals(evs, 2)
    assert (t["indexer"], t["projections"], t["sparse_mla"]) == (6.0, 45.0, 7.5)
    assert t["other_kernels"] == 2.5 and t["kernels_per_step"] == 3.5    # prep_q and the window
    old = [_Ev("dsa::indexer_topk", cpu, 19.0), _Ev("dsa::window_split", cpu, 1.0),
           _Ev("_window_split_kernel", cuda, 1.0), _Ev("_radix_topk_kernel", cuda, 19.0)]
    for e in old:
        e.cpu_parent = None
    t = paths.layer_phase_totals(old, 1)
    assert (t["indexer"], t["other_kernels"]) == (19.0, 1.0)


def test_jax_layer_phases_from_a_fake_device_trace():
    """bench.paths.jax_trace_kernels keeps the kernels of the GPU processes' stream threads only
    (not the derived XLA Ops line, not host events); jax_phase_totals splits them by name into
    the three phases and the rest, per call."""
    M = lambda name, pid, tid=None, what="process_name": dict(  # noqa: E731
        ph="M", name=what, pid=pid, **({} if tid is None else {"tid": tid}), args={"name": name})
    X = lambda name, pid, tid, dur: dict(ph="X", name=name, pid=pid, tid=tid, ts=0, dur=dur)  # noqa: E731
    trace = {"traceEvents": [
        M("/device:GPU:0", 1), M("Stream #14(Compute)", 1, 7, "thread_name"),
        M("XLA Ops", 1, 8, "thread_name"), M("/host:CPU", 2), M("python", 2, 1, "thread_name"),
        X("sparse_mla_split", 1, 7, 40.0), X("sparse_mla_combine", 1, 7, 4.0),
        X("indexer_logits", 1, 7, 30.0), X("indexer_topk_select", 1, 7, 10.0),
        X("sm90_xmma_gemm_bf16bf16_bf16f32", 1, 7, 50.0), X("nvjet_tst_64x8", 1, 7, 20.0),
        X("loop_multiply_fusion", 1, 7, 6.0), X("input_reduce_fusion_2", 1, 7, 2.0),
        X("custom-call.3", 1, 8, 44.0),                  # the XLA Ops line repeats a kernel
        X("PjitFunction(step)", 2, 1, 500.0)]}           # a host event
    k = paths.jax_trace_kernels(trace)
    assert len(k) == 8 and ("custom-call.3", 44.0) not in k
    t = paths.jax_phase_totals(k, n_calls=2)
    assert (t["sparse_mla"], t["indexer"], t["projections"], t["other_kernels"]) == (22.0, 20.0, 35.0, 4.0)
    assert t["kernels_per_step"] == 4.0
    assert t["other_top"] == {"loop_multiply_fusion": 3.0, "input_reduce_fusion_2": 1.0}


def test_jax_layer_group_chains_steps_and_threads_caches():
    """The JAX layer rows' timer unit (``paths._DonatingLayerGroup``): one jitted call runs
    ``steps`` layer steps over the rotated sets in turn, each set's caches threaded from step to
    step and handed back to its member (donated), the steps chained through an optimisation
    barrier; ``timing.time_jax_steps`` divides by the steps. A stand-in step: ``out = x * w +
    sum(kv)``, ``kv += 1``, ``kc += 2``."""
    import warnings

    import jax
    import jax.numpy as jnp
    from bench import timing

    def step(state, x, kv, kc, bt, cl):
        return {"out": x * state["w"] + kv.sum(), "kv_cache": kv + 1.0, "k_cache": kc + 2.0,
                "indices": bt + cl}

    class Member:
        def __init__(self, i):
            self.x, self.kv, self.kc = jnp.full((2,), float(i)), jnp.zeros(4), jnp.zeros(3)
            self.bt, self.cl = jnp.arange(2), jnp.ones(2, jnp.int32)

    members = [Member(i) for i in range(3)]
    g = paths._DonatingLayerGroup(step, {"w": jnp.float32(2.0)}, members, steps=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # XLA:CPU may not use donated buffers
        outs = g()
        assert len(outs) == 5 and all(set(o) == {"out", "indices"} for o in outs)
        # steps 0..4 ran sets 0, 1, 2, 0, 1: step 3 saw set 0's kv after one step (sum 4)
        assert [float(o["out"][0]) for o in outs] == [0.0, 2.0, 4.0, 4.0, 6.0]
        assert [float(m.kv[0]) for m in members] == [2.0, 2.0, 1.0]
        assert [float(m.kc[0]) for m in members] == [4.0, 4.0, 2.0]
        hlo = g.f.lower(g.state, *[tuple(getattr(m, a) for m in members)
                                   for a in ("x", "kv", "kc", "bt", "cl")]).as_text()
        assert hlo.count("optimization_barrier") == 4      # one between two steps
        t = timing.time_jax_steps(g, target_s=0.001, max_batches=2, min_batches=1)
    assert t.samples >= 1 and "chain of 5 layer steps per dispatch" in t.timer
    assert timing.time_jax([type("C", (), {"group": g, "__call__": lambda self: None})()],
                           target_s=0.001, max_batches=1, min_batches=1).timer == t.timer
    assert paths._DonatingLayerGroup(step, {}, members).steps == paths.LAYER_GROUP_STEPS


def test_layer_group_steps_switch(monkeypatch):
    monkeypatch.delenv("DSA_BENCH_LAYER_STEPS", raising=False)
    assert paths.layer_group_steps() == paths.LAYER_GROUP_STEPS
    monkeypatch.setenv("DSA_BENCH_LAYER_STEPS", "3")
    assert paths.layer_group_steps() == 3
    for bad in ("0", "-2", "4.5", "x"):
        monkeypatch.setenv("DSA_BENCH_LAYER_STEPS", bad)
        with pytest.raises(ValueError, match=rf"^DSA_BENCH_LAYER_STEPS: expected a positive integer, got '{bad}'"):
            paths.layer_group_steps()


def test_jax_layer_hlo_saved_where_asked(tmp_path, monkeypatch):
    """BENCH_HLO_DIR: the jax layer row's optimised HLO (the text its projection kernels are
    read from) is written under it, named by the row's label with path-safe characters; unset,
    nothing is written."""
    from bench import runner

    class Call:
        def hlo_text(self):
            return _GPU_HLO

        def __call__(self):
            return None

    monkeypatch.setattr(paths, "_jax_device_kernels", lambda calls, reps: [])
    class Shape:                   # the runner passes the row's grid.Shape (label a method)
        def __init__(self, label):
            self.label = lambda: label

    shape = next(sh for sh in grid.grid_for("targets") if sh.op == "dsa_decode_layer")
    monkeypatch.delenv("BENCH_HLO_DIR", raising=False)
    assert runner._hlo_path(shape) is None
    monkeypatch.setenv("BENCH_HLO_DIR", str(tmp_path / "hlo"))
    assert runner._hlo_path(shape).name.endswith(".hlo.txt")       # a real Shape's label
    path = runner._hlo_path(Shape("layer DSV4_FLASH B=1 N=1 (x/y)"))
    assert path == tmp_path / "hlo" / "layer_DSV4_FLASH_B_1_N_1__x_y_.hlo.txt"
    out = paths.jax_layer_phases([Call()], reps=1, save_hlo=path)
    assert path.read_text() == _GPU_HLO and out["kernels_per_step"] == 0
    assert out["hlo_command_buffers"] == paths.hlo_command_buffer_summary(_GPU_HLO)


def test_hlo_command_buffer_summary():
    """What of an optimised HLO's ENTRY runs outside XLA's command buffers: the call of a
    ``command_buffer`` computation counts apart (its two fusions inside), parameters and the
    tuple launch nothing, the rest by op and custom calls by target (a Pallas kernel's
    ``__gpu$xla.gpu.triton``, a while loop); an HLO without command buffers says 0 calls."""
    s = paths.hlo_command_buffer_summary(_GPU_HLO)
    assert s == {"command_buffer_calls": 1, "ops_in_command_buffers": 2,
                 "ops_outside": {"custom-call": 1, "fusion": 2},
                 "custom_calls_outside": {"__cublas$gemm": 1}}
    pallas = _GPU_HLO.replace(
        "  ROOT %tuple = (bf16[1,2240]{1,0}, f32[1]{0}) tuple(%call.1, %input_reduce_fusion)",
        '  %custom-call.5 = f32[64]{0} custom-call(%Arg_2.3), custom_call_target="__gpu$xla.gpu.triton", '
        'backend_config={name = "indexer_logits"} /*index=5*/\n'
        "  %while.2 = (s32[], f32[1]{0}) while(%Arg_2.3), condition=%cond, body=%body\n"
        "  ROOT %tuple = (bf16[1,2240]{1,0}, f32[1]{0}) tuple(%call.1, %input_reduce_fusion)")
    s = paths.hlo_command_buffer_summary(pallas)
    assert s["custom_calls_outside"] == {"__cublas$gemm": 1, "__gpu$xla.gpu.triton": 1}
    assert s["ops_outside"] == {"custom-call": 2, "fusion": 2, "while": 1}
    plain = _GPU_HLO.replace("to_apply=%command_buffer", "to_apply=%fused_convert")
    assert paths.hlo_command_buffer_summary(plain) == {
        "command_buffer_calls": 0, "ops_in_command_buffers": 0,
        "ops_outside": {"call": 1, "custom-call": 1, "fusion": 2},
        "custom_calls_outside": {"__cublas$gemm": 1}}


_GPU_HLO = """HloModule jit_step, entry_computation_layout={...}

%fused_reduce (param_0: bf16[1,7168], param_1: bf16[2240,7168]) -> f32[1,2240] {
  %param_0 = bf16[1,7168]{1,0} parameter(0)
  %param_1 = bf16[2240,7168]{1,0} parameter(1)
  %broadcast.1 = bf16[2240,7168]{1,0} broadcast(%param_0), dimensions={1}
  %multiply.3 = bf16[2240,7168]{1,0} multiply(%broadcast.1, %param_1), metadata={op_name="jit(step)/jit(main)/DSADecodeLayer/dot_general" source_file="layer.py"}
  %constant.2 = f32[] constant(0)
  ROOT %reduce.4 = f32[1,2240]{1,0} reduce(%multiply.3, %constant.2), dimensions={1}, to_apply=%add, metadata={op_name="jit(step)/jit(main)/DSADecodeLayer/dot_general"}
}

%fused_convert (param_0.1: f32[1,2240]) -> bf16[1,2240] {
  %param_0.1 = f32[1,2240]{1,0} parameter(0)
  ROOT %convert.5 = bf16[1,2240]{1,0} convert(%param_0.1), metadata={op_name="jit(step)/jit(main)/dot_general"}
}

%fused_norm (param_0.2: bf16[1,1536]) -> f32[1] {
  %param_0.2 = bf16[1,1536]{1,0} parameter(0)
  %multiply.9 = bf16[1,1536]{1,0} multiply(%param_0.2, %param_0.2), metadata={op_name="jit(step)/jit(main)/square"}
  %constant.3 = f32[] constant(0)
  ROOT %reduce.10 = f32[1]{0} reduce(%multiply.9, %constant.3), dimensions={1}, to_apply=%add, metadata={op_name="jit(step)/jit(main)/reduce_sum"}
}

%gemm_fusion_dot.7_computation (p0: bf16[64,1536], p1: bf16[24576,1536]) -> bf16[64,24576] {
  %p0 = bf16[64,1536]{1,0} parameter(0)
  %p1 = bf16[24576,1536]{1,0} parameter(1)
  ROOT %dot.7 = bf16[64,24576]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

%command_buffer (p.0: bf16[1,7168], p.1: bf16[2240,7168]) -> bf16[1,2240] {
  %p.0 = bf16[1,7168]{1,0} parameter(0)
  %p.1 = bf16[2240,7168]{1,0} parameter(1)
  %input_reduce_fusion.8 = f32[1,2240]{1,0} fusion(%p.0, %p.1), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(step)/jit(main)/DSADecodeLayer/dot_general"}
  ROOT %loop_convert_fusion = bf16[1,2240]{1,0} fusion(%input_reduce_fusion.8), kind=kLoop, calls=%fused_convert, metadata={op_name="jit(step)/jit(main)/dot_general"}
}

ENTRY %main.99 (Arg_0.1: bf16[1,7168], Arg_1.2: bf16[2240,7168], Arg_2.3: bf16[1,1536]) -> (bf16[1,2240], f32[1]) {
  %Arg_0.1 = bf16[1,7168]{1,0} parameter(0)
  %Arg_1.2 = bf16[2240,7168]{1,0} parameter(1)
  %Arg_2.3 = bf16[1,1536]{1,0} parameter(2)
  %call.1 = bf16[1,2240]{1,0} call(%Arg_0.1, %Arg_1.2), to_apply=%command_buffer
  %input_reduce_fusion = f32[1]{0} fusion(%Arg_2.3), kind=kInput, calls=%fused_norm
  %cublas-gemm.1 = (bf16[64,7168]{1,0}, s8[4194304]{0}) custom-call(%Arg_0.1, %Arg_1.2), custom_call_target="__cublas$gemm"
  %gemm_fusion_dot.7 = bf16[64,24576]{1,0} fusion(%Arg_2.3, %Arg_1.2), kind=kCustom, calls=%gemm_fusion_dot.7_computation
  ROOT %tuple = (bf16[1,2240]{1,0}, f32[1]{0}) tuple(%call.1, %input_reduce_fusion)
}
"""


def test_jax_projection_kernels_from_the_optimised_hlo():
    """bench.paths.jax_projection_kernels names the kernels that are dots in an XLA:GPU module:
    a GEMV rewritten into multiply + reduce (metadata of a dot_general, inside a command-buffer
    computation), a cuBLAS custom call and a Triton GEMM fusion; not the convert fusion that
    only carries a dot's metadata, nor an rms-norm reduce. jax_phase_totals then counts those
    kernels as projections (the Pallas kernels keep their own phases), which the by-name rule
    alone counted as glue (the jax V4 B 1 rows of 2026-12-04: projections at 143 % of copy)."""
    proj = paths.jax_projection_kernels(_GPU_HLO)
    assert proj == {"input_reduce_fusion_8", "cublas_gemm_1", "gemm_fusion_dot_7"}, proj
    k = [("input_reduce_fusion_8", 10.0), ("loop_convert_fusion", 1.0), ("input_reduce_fusion", 2.0),
         ("sparse_mla_split", 5.0), ("indexer_topk_select", 3.0)]
    t = paths.jax_phase_totals(k, n_calls=1, projection_kernels=proj)
    assert (t["projections"], t["sparse_mla"], t["indexer"], t["other_kernels"]) == (10.0, 5.0, 3.0, 3.0)
    t = paths.jax_phase_totals(k, n_calls=1)                    # by name only: a GEMV is glue
    assert (t["projections"], t["other_kernels"]) == (0.0, 13.0)


def test_jax_projection_kernels_by_weight_operands():
    """A GEMV fusion whose multiply / reduce carry no dot metadata (the H200 module of
    2026-12-05: the metadata rule named no kernel) counts as a projection when its computation
    takes an array of a weight's dtype and element count (a reshaped weight too), and only
    then; a norm fusion over an activation does not; arrays under 2^16 elements are no keys."""
    hlo = _GPU_HLO.replace(
        ', metadata={op_name="jit(step)/jit(main)/DSADecodeLayer/dot_general" source_file="layer.py"}',
        "").replace(', to_apply=%add, metadata={op_name="jit(step)/jit(main)/DSADecodeLayer/dot_general"}',
                    ", to_apply=%add").replace(
        ', kind=kInput, calls=%fused_reduce, metadata={op_name="jit(step)/jit(main)/DSADecodeLayer/dot_general"}',
        ", kind=kInput, calls=%fused_reduce")
    assert "input_reduce_fusion_8" not in paths.jax_projection_kernels(hlo)
    w = np.zeros((2240 * 7168,), ml_dtypes.bfloat16).reshape(7168, 2240)   # same count, reshaped
    keys = paths.hlo_weight_keys([w, np.zeros((4, 4), np.float32)])
    assert keys == {("bf16", 2240 * 7168)}
    proj = paths.jax_projection_kernels(hlo, keys)
    assert proj == {"input_reduce_fusion_8", "cublas_gemm_1", "gemm_fusion_dot_7"}, proj
    assert "input_reduce_fusion" not in proj                  # the norm: reads no weight
    assert paths.jax_projection_kernels(hlo, {("f32", 2240 * 7168)}) == {"cublas_gemm_1",
                                                                        "gemm_fusion_dot_7"}


def test_jax_projection_kernels_of_a_compiled_module():
    """The parser on a module XLA compiled here (the CPU's HLO text: top-level dots and dot
    fusions): every dot of a GEMV-shaped step and an einsum is found, nothing else."""
    import jax
    import jax.numpy as jnp

    def f(x, w, v):
        y = x @ w.T
        z = jnp.sqrt(jnp.mean(y * y, -1, keepdims=True))
        return (y / z) @ v.T, jnp.einsum("bd,hd->bh", x, w[:16])
    args = (jnp.ones((1, 256), jnp.bfloat16), jnp.ones((512, 256), jnp.bfloat16),
            jnp.ones((64, 512), jnp.bfloat16))
    text = jax.jit(f).lower(*args).compile().as_text()
    proj = paths.jax_projection_kernels(text)
    assert len(proj) == 3 and all("dot" in n for n in proj), proj


def test_jax_projection_kernels_with_six_or_more_parameters():
    """A module of six or more parameters (the layer step's ENTRY takes 16): XLA numbers every
    fifth one in a comment (``/*index=5*/``) inside the computation's header. Its "=" once made
    the header read as an instruction, the ENTRY's dots fell into the computation printed before
    it and no projection was found (the jax layer rows of 2026-12-05 on the H100 and the H200,
    ``hlo_projection_kernels`` empty); every dot is found now, in the ENTRY and in a wide fusion's
    header (the weight rule)."""
    import jax
    import jax.numpy as jnp

    def f(x, w0, w1, w2, w3, w4, w5):
        return [x @ w.T for w in (w0, w1, w2, w3, w4, w5)]
    args = (jnp.ones((1, 256), jnp.bfloat16),) + tuple(
        jnp.ones((64 + 16 * i, 256), jnp.bfloat16) for i in range(6))
    text = jax.jit(f).lower(*args).compile().as_text()
    assert "/*index=5*/" in text
    proj = paths.jax_projection_kernels(text)
    assert len(proj) == 6 and all("dot" in n for n in proj), proj
    wide = """HloModule m

%fused_gemv (p0: bf16[1,256], p1: f32[4], p2: f32[4], p3: f32[4], p4: f32[4], /*index=5*/p5: bf16[512,256]) -> f32[1,512] {
  %p5 = bf16[512,256]{1,0} parameter(5)
  ROOT %r = f32[1,512]{1,0} reduce(%p5), dimensions={1}
}

ENTRY %main (a: bf16[1,256], b: f32[4], c: f32[4], d: f32[4], e: f32[4], /*index=5*/w: bf16[512,256]) -> f32[1,512] {
  %a = bf16[1,256]{1,0} parameter(0)
  %w = bf16[512,256]{1,0} parameter(5)
  ROOT %input_reduce_fusion.3 = f32[1,512]{1,0} fusion(%a, %a, %a, %a, %a, /*index=5*/%w), kind=kInput, calls=%fused_gemv
}
"""
    assert paths.jax_projection_kernels(wide, {("bf16", 512 * 256)}) == {"input_reduce_fusion_3"}
    assert paths.jax_projection_kernels(wide) == set()


def test_jax_timer_groups_calls_per_dispatch():
    """bench.timing.time_jax: partials of one jitted function (the op rows) run in jitted groups
    of calls over distinct rotated sets, one dispatch per group (issue 16: B 1 rows measured
    dispatch); XLA keeps one call per set (no merged calls: one dot each in the group's
    executable) and returns every output. Other callables (the layer's donating calls) keep
    the per-call async batch."""
    import functools

    import jax
    import jax.numpy as jnp
    from bench import timing

    f = jax.jit(lambda a, b: {"y": (a @ b).sum(0), "z": a[0]})
    calls = [functools.partial(f, jnp.full((64, 64), float(i)), jnp.ones((64, 64))) for i in range(5)]
    t = timing.time_jax(calls, target_s=0.02)
    assert t.timer.startswith("jax jitted groups (5 calls per dispatch") and t.median_us > 0
    g, groups = timing.jax_call_groups(f, [c.args for c in calls])
    assert len(groups) == 1 and len(groups[0]) == 5
    text = g.lower(groups[0]).compile().as_text()
    assert sum(" dot(" in ln for ln in text.splitlines()) == 5
    out = g(groups[0])
    assert [float(o["y"][0]) for o in out] == [64.0 * 64 * i for i in range(5)]
    g, groups = timing.jax_call_groups(f, [c.args for c in calls] * 8)       # 40 sets
    assert [len(gr) for gr in groups] == [timing.GROUP_CALLS] * 2             # full groups only
    t = timing.time_jax([lambda: f(*calls[0].args)], target_s=0.02)          # not a partial
    assert t.timer.startswith("jax async batch")


def test_jax_indexer_phases_by_kernel_name():
    """bench.paths.jax_indexer_phase_totals: the Pallas logits kernel and the four Pallas top-k
    kernels by name, per call; XLA's small kernels around them (pads) are in neither phase."""
    k = [("indexer_logits", 30.0), ("indexer_topk_prune", 4.0), ("indexer_topk_count", 2.0),
         ("indexer_topk_compact", 3.0), ("indexer_topk_select", 7.0), ("loop_pad_fusion", 1.0)]
    t = paths.jax_indexer_phase_totals(k, n_calls=2)
    assert t == {"logits_us": 15.0, "topk_us": 8.0,
                 "topk_kernels_us": {"indexer_topk_compact": 1.5, "indexer_topk_count": 1.0,
                                     "indexer_topk_prune": 2.0, "indexer_topk_select": 3.5}}


def test_layer_phases_ratios_and_an_empty_profile(monkeypatch):
    """runner._layer_phases: glue = step - the three phases, the ratios of issue 15 and the
    projections' fraction of the copy bandwidth from the phases; a profile that saw no kernel
    (the jax tracer after torch.profiler in one process: CUPTI refuses the second subscriber)
    is a phases_error, never phases of zero (which read as 100 % glue)."""
    from types import SimpleNamespace
    from bench import runner
    ph = dict(projections=100.0, indexer=50.0, sparse_mla=50.0, other_kernels=30.0,
              kernels_per_step=40.0)
    monkeypatch.setattr(paths, "torch_layer_phases", lambda calls: ph)
    machine = SimpleNamespace(copy_bytes_per_s=4e12)
    r = runner._layer_phases([], 250.0, "torch", machine, weight_bytes=300_000_000)
    assert r["phases_us"]["glue"] == 50.0 and r["glue_frac"] == 0.2 and r["step_over_phases"] == 1.25
    assert r["projections_frac_copy"] == pytest.approx(0.75)     # 300 MB / 100 us = 3 TB/s of 4
    monkeypatch.setattr(paths, "jax_layer_phases", lambda calls, save_hlo=None: dict(ph, kernels_per_step=0.0,
                        projections=0.0, indexer=0.0, sparse_mla=0.0, other_kernels=0.0))
    r = runner._layer_phases([], 250.0, "jax", machine, weight_bytes=300_000_000)
    assert set(r) == {"phases_error"} and "CUPTI" in r["phases_error"]


@pytest.mark.parametrize("env, device, compiled", [
    (None, "cuda", True), (None, "cuda:1", True), (None, "cpu", False),
    ("0", "cuda", False), ("1", "cpu", True), ("", "cuda", True)])
def test_layer_rows_compile_on_cuda_by_default(monkeypatch, env, device, compiled):
    """The torch layer rows time torch.compile(layer, fullgraph=True) on CUDA unless
    DSA_BENCH_COMPILE_LAYER=0 (the eager module), and the eager module on the CPU unless =1."""
    if env is None:
        monkeypatch.delenv("DSA_BENCH_COMPILE_LAYER", raising=False)
    else:
        monkeypatch.setenv("DSA_BENCH_COMPILE_LAYER", env)
    assert paths._compile_layer(device) is compiled


def test_print_table_shows_topk_us():
    from rich.console import Console
    row = dict(report_row_stub(), topk_us=12.34)
    con = Console(width=250, record=True, file=io.StringIO())
    report.print_table([row], {"gpu": "x", "compute_capability": "0.0", "date": "d",
                               "command": "c"}, console=con)
    text = con.export_text()
    assert "topk us" in text and "12.3" in text


def report_row_stub() -> dict:
    from bench.runner import base_row
    r = base_row(grid.Shape("indexer_topk", "DSV32", 2, 1, 1, 256, topk=64), "torch", "triton")
    return dict(r, median_us=50.0, p20_us=49.0, p80_us=51.0, status="ok")


def _no_run(cfg):
    raise AssertionError("a usage error must be reported before the run starts")


@pytest.mark.parametrize("argv, message", [
    (["--budget-s", "-1"], "argument --budget-s: expected a positive finite number, got '-1'"),
    (["--budget-s", "0"], "argument --budget-s: expected a positive finite number, got '0'"),
    (["--max-gb", "0"], "argument --max-gb: expected a positive finite number, got '0'"),
    (["--ref-max-positions", "0"], "argument --ref-max-positions: expected a positive integer, got 0"),
    (["--max-gb", "nan"], "argument --max-gb: expected a positive finite number, got 'nan'"),
    (["--max-gb", "lots"], "argument --max-gb: expected a positive number, got 'lots'"),
    (["--out", "/proc/nope"], "argument --out: expected a writable directory, got '/proc/nope': "
                              "cannot create files in /proc"),
])
def test_cli_bad_values_exit_2_before_running(tmp_path, stub_registry, monkeypatch, capsys, argv, message):
    import bench.runner
    from bench.__main__ import main
    monkeypatch.setattr(bench.runner, "run", _no_run)
    with pytest.raises(SystemExit) as e:
        main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--no-plot", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("var,value,message", [
    ("DSA_LAYER_OVERLAP", "yes", "environment: DSA_LAYER_OVERLAP: expected '0', '1' or unset, got 'yes'"),
    ("DSA_LAYER_OVERLAP_CARVEOUT", "-1", "environment: DSA_LAYER_OVERLAP_CARVEOUT: expected a non-negative"),
    ("DSA_LAYER_FUSED_PREP", "2", "environment: DSA_LAYER_FUSED_PREP: expected '0', '1' or unset, got '2'"),
    ("DSA_LAYER_LINEAR", "x_proj", "environment: linear: expected 'torch', 'triton', 'auto', 'gemv' or"),
    ("DSA_BENCH_LAYER_STEPS", "0", "environment: DSA_BENCH_LAYER_STEPS: expected a positive integer"),
    ("DSA_TOPK_PDL", "on", "environment: DSA_TOPK_PDL: expected '0', '1' or unset, got 'on'"),
    ("DSA_LINEAR_GEMV", "true", "environment: DSA_LINEAR_GEMV: expected '0', '1' or unset, got 'true'"),
    ("DSA_TOPK_SCATTER_SUB", "0", "environment: DSA_TOPK_SCATTER_SUB: expected an integer in [1, 16]"),
    ("DSA_IDX_WS_FUSED_HIST_MAX_N", "3",
     "environment: DSA_IDX_WS_FUSED_HIST_MAX_N: expected '0', '1', '2' or unset, got '3'"),
    ("DSA_TOPK_SPLIT_PLAN", "off", "environment: DSA_TOPK_SPLIT_PLAN: expected '0', '1' or unset, got 'off'"),
    ("DSA_TOPK_SCATTER_FORM", "gluon",
     "environment: DSA_TOPK_SCATTER_FORM: expected one of ('triton', 'smem') or unset, got 'gluon'"),
    ("DSA_TOPK_PART_PRE", "on", "environment: DSA_TOPK_PART_PRE: expected '0', '1' or unset, got 'on'"),
    ("DSA_LAYER_JOINT_GEMV", "2", "environment: DSA_LAYER_JOINT_GEMV: expected '0', '1' or unset, got '2'"),
    ("DSA_LAYER_TOPK_WINDOW", "no", "environment: DSA_LAYER_TOPK_WINDOW: expected '0', '1' or unset, got 'no'"),
    ("DSA_LAYER_SPLIT_WPROJ", "yes", "environment: DSA_LAYER_SPLIT_WPROJ: expected '0', '1' or unset, got 'yes'"),
    ("DSA_LAYER_XW_JOINT", "2", "environment: DSA_LAYER_XW_JOINT: expected '0', '1' or unset, got '2'"),
    ("DSA_JAX_LAYER_ROPE_LANES", "2",
     "environment: DSA_JAX_LAYER_ROPE_LANES: expected '0', '1' or unset, got '2'"),
    ("DSA_TOPK_UNFUSED_PER_SM", "65",
     "environment: DSA_TOPK_UNFUSED_PER_SM: expected an integer in [0, 64] or unset, got '65'"),
])
def test_cli_bad_environment_exits_2_before_running(tmp_path, stub_registry, monkeypatch, capsys, var,
                                                    value, message):
    """A switch the timed paths read, set to a value they refuse, is a usage error before
    anything runs (before: each layer row failed with the switch's ValueError)."""
    import bench.runner
    from bench.__main__ import main
    monkeypatch.setattr(bench.runner, "run", _no_run)
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as e:
        main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--no-plot"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert list(tmp_path.iterdir()) == []


def test_cli_bad_environment_checks_only_the_selected_backends(tmp_path, stub_registry, monkeypatch, capsys):
    """A torch-only run neither reads nor refuses the JAX layer's switch (and does not import the
    JAX layer to check it); with both backends selected it is refused."""
    import bench.runner
    from bench.__main__ import _bad_environment, main
    monkeypatch.setattr(bench.runner, "run", _no_run)
    monkeypatch.setenv("DSA_JAX_LAYER_ROPE_LANES", "2")
    assert _bad_environment(("torch",)) is None
    assert "DSA_JAX_LAYER_ROPE_LANES: expected '0', '1' or unset, got '2'" in _bad_environment(("jax",))
    assert "DSA_JAX_LAYER_ROPE_LANES" in _bad_environment(None)
    monkeypatch.delenv("DSA_JAX_LAYER_ROPE_LANES")
    monkeypatch.setenv("DSA_LAYER_JOINT_GEMV", "2")
    assert _bad_environment(("jax",)) is None
    assert "DSA_LAYER_JOINT_GEMV: expected '0', '1' or unset, got '2'" in _bad_environment(("torch",))
    with pytest.raises(SystemExit) as e:
        main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--no-plot", "--backend", "torch"])
    assert e.value.code == 2
    assert "DSA_LAYER_JOINT_GEMV" in capsys.readouterr().err


def test_cli_out_must_be_a_writable_directory(tmp_path, stub_registry, monkeypatch, capsys):
    import bench.runner
    from bench.__main__ import main
    monkeypatch.setattr(bench.runner, "run", _no_run)
    (tmp_path / "f").write_text("x")
    for out, why in [(tmp_path / "f", "exists and is not a directory"),
                     (tmp_path / "f" / "sub", "is not a directory")]:
        with pytest.raises(SystemExit) as e:
            main(["--dry-run", "--out", str(out), "--no-progress"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "argument --out: expected a writable directory" in err and why in err, err
    with pytest.raises(SystemExit) as e:
        main(["--dry-run", "--out", str(tmp_path), "--write-dispatch", "--dispatch-dir", str(tmp_path / "f")])
    assert e.value.code == 2
    assert "argument --dispatch-dir: expected a writable directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_cli_empty_selection_exits_2_like_parity(tmp_path, stub_registry, monkeypatch, capsys):
    import bench.runner
    from bench.__main__ import main
    monkeypatch.setattr(grid, "dry_grid", _small_shapes)
    monkeypatch.setattr(bench.runner, "run", _no_run)
    rc = main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--backend", "jax", "--path", "triton"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no path matches --backend jax --path triton" in err and "jax: pallas, xla" in err, err
    rc = main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--op", "indexer_topk",
               "--preset", "DSV4_FLASH"])
    assert rc == 2
    assert "no shape of the dry grid matches --op indexer_topk --preset DSV4_FLASH" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []                              # no empty JSON
    # the library entry point refuses the same selection
    monkeypatch.undo()
    monkeypatch.setattr(paths, "REGISTRY", stub_registry)
    with pytest.raises(ValueError, match="cfg: no path matches --backend jax --path triton"):
        run(RunConfig(mode="dry", out=tmp_path, backends=("jax",), paths=("triton",), progress=False))
    assert list(tmp_path.iterdir()) == []


def test_dry_run_dispatch_dir_is_git_ignored():
    """``python -m bench --write-dispatch`` on a CPU writes bench/results/dispatch/interpreter.json
    (the README's contributing steps commit only kernels/dispatch/<arch>.json)."""
    import shutil
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if shutil.which("git") is None or not os.path.isdir(os.path.join(root, ".git")):
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "-v", "bench/results/dispatch/interpreter.json"],
                       cwd=root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and ".gitignore" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["git", "check-ignore", "-q", "kernels/dispatch/sm_120.json"], cwd=root, timeout=60)
    assert r.returncode == 1                                           # GPU tables stay tracked


def test_unavailable_backend_is_reported_not_failed(tmp_path, monkeypatch):
    class Missing(paths.Backend):
        name, paths = "torch", ("triton", "torch")

        def load(self):
            raise ImportError("No module named 'torch_impl.nothing'")
    monkeypatch.setattr(paths, "REGISTRY", {"torch": Missing()})
    monkeypatch.setattr(grid, "dry_grid", lambda: _small_shapes()[:1])
    res = run(RunConfig(mode="dry", out=tmp_path, progress=False, plot=False))
    assert [r["status"] for r in res["rows"]] == ["unavailable: ImportError: No module named 'torch_impl.nothing'"] * 2
    assert "torch/triton" in res["meta"]["unavailable"]


# ----------------------------------------------------------------------------- the real paths

def _require_a_binding():
    found = paths.discover()
    if all(a is None for a, _ in found.values()):
        pytest.skip("no op backend imports yet: " + "; ".join(f"{k}: {w}" for k, (_, w) in found.items()))


def _tiny_op_shapes():
    """One tiny V3.2 fp8 sparse-MLA shape and one V4-Flash indexer shape (the real-path runs)."""
    S = grid.Shape
    return [S("sparse_mla_decode", "DSV32", 2, 1, 8, 128, "fp8", topk=32, window=0),
            S("indexer_topk", "DSV4_FLASH", 1, 1, 1, 100, topk=32)]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="the dry run is the CPU interpreter's plumbing check; on a GPU "
                           "`python -m bench` runs the real paths itself")
def test_dry_run_real_paths(tmp_path, monkeypatch):
    """Every path that imports, on one tiny V3.2 fp8 shape, passes its reference check."""
    _require_a_binding()
    monkeypatch.setattr(grid, "dry_grid", _tiny_op_shapes)
    res = run(RunConfig(mode="dry", out=tmp_path, progress=False, plot=False))
    ran = 0
    for r in res["rows"]:
        if r["status"].startswith("unavailable"):
            continue
        assert r["status"] == "ok", (r["backend"], r["path"], r["op"], r["status"])
        assert r["check"]["passed"] and r["median_us"] > 0
        if r["op"] == "indexer_topk" and r["backend"] == "torch":
            # topk_us on the CPU: the interpreter's time inside the top-k phase's profiler range
            assert r["topk_us"] > 0 and r["logits_us"] > 0, r
            assert r["topk_timer"].startswith("torch.profiler, CPU interpreter")
        ran += 1
    assert ran >= 1


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="the dry run is the CPU interpreter's plumbing check; on a GPU "
                           "`python -m bench --op dsa_decode_step` runs the real paths itself")
def test_dry_run_real_step_with_window(tmp_path, monkeypatch):
    """The decode-step adapters call the bindings' ``dsa_decode_step(window=...)``: one tiny
    V4-Flash shape with its sliding window on the two plain paths (the kernel paths run the same
    adapter code), checked (top-k over the positions before the window) and timed."""
    _require_a_binding()
    monkeypatch.setattr(grid, "dry_grid", lambda: [
        grid.Shape("dsa_decode_step", "DSV4_FLASH", 2, 1, 8, 160, "fp8", topk=32, window=16)])
    res = run(RunConfig(mode="dry", out=tmp_path, progress=False, plot=False, paths=("torch", "xla")))
    ran = [r for r in res["rows"] if not r["status"].startswith("unavailable")]
    assert ran, res["rows"]
    for r in ran:
        assert r["status"] == "ok", (r["backend"], r["path"], r["status"])
        assert r["check"]["passed"] and r["step_impl"].endswith("dsa_decode_step(window=16)")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="the dry run is the CPU interpreter's plumbing check; on a GPU "
                           "`python -m bench --op dsa_decode_layer` runs the real paths itself")
def test_dry_run_real_layer_paths(tmp_path, monkeypatch):
    """The decode-layer adapters on the real bindings (torch eager with in-place cache writes;
    JAX jitted with donated caches), one scaled-down V3.2 shape, the two plain paths (the kernel
    paths are the same layer code around the ops test_dry_run_real_paths covers): checked
    against the float64 layer reference, then timed."""
    _require_a_binding()
    monkeypatch.setattr(grid, "dry_grid", lambda: [
        grid.Shape("dsa_decode_layer", "DSV32", 2, 1, 1, 128, "fp8", topk=32, window=0, heads=4)])
    res = run(RunConfig(mode="dry", out=tmp_path, progress=False, plot=False, paths=("torch", "xla")))
    ran = 0
    for r in res["rows"]:
        if r["status"].startswith("unavailable"):
            continue
        assert r["status"] == "ok", (r["backend"], r["path"], r["status"])
        assert r["check"]["passed"] and r["median_us"] > 0 and r["bytes"] > r["weight_bytes"]
        ran += 1
    assert ran >= 1


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="a CPU-interpreter round trip; on a GPU `python -m bench --write-dispatch` "
                           "then `python -m bench --path auto` is the same check")
def test_auto_rows_run_the_fastest_checked_path_and_config(tmp_path, monkeypatch):
    """A dry run writes the dispatch table from its fastest checked rows; a second dry run, with
    that table as the dispatch directory, times ``path="auto"``: for every op and backend the
    auto row runs (and records) the path and config of that backend's fastest checked row, the
    bindings' own plans (``kernels.registry``) chose the same, and the row passes its check."""
    from kernels.registry import Registry

    _require_a_binding()
    monkeypatch.setattr(grid, "dry_grid", _tiny_op_shapes)
    first = run(RunConfig(mode="dry", out=tmp_path / "a", progress=False, plot=False,
                          write_dispatch=True))
    table = json.loads(first["dispatch"].read_text())
    entries = {(e["op"], e["backend"]): e for e in table["entries"]}
    checked = [r for r in first["rows"] if r["status"] == "ok"]
    assert {(r["op"], r["backend"]) for r in checked} == set(entries)

    planned = []                                     # every plan made while the auto rows run
    real_plan = Registry.plan

    def spy(self, op, backend, dev, *, path="auto", **shape):
        p = real_plan(self, op, backend, dev, path=path, **shape)
        planned.append((op, backend, path, p.path, p.config))
        return p
    monkeypatch.setattr(Registry, "plan", spy)
    monkeypatch.setenv(dispatch.DISPATCH_DIR_ENV, str(first["dispatch"].parent))
    dispatch.clear_cache()
    second = run(RunConfig(mode="dry", out=tmp_path / "b", progress=False, plot=False,
                           paths=("auto",)))
    dispatch.clear_cache()
    ran = 0
    for r in second["rows"]:
        if r["status"].startswith("unavailable"):
            continue
        assert r["path"] == "auto" and r["status"] == "ok", (r["op"], r["backend"], r["status"])
        key = (r["op"], r["backend"])
        fastest = min((x for x in checked if (x["op"], x["backend"]) == key),
                      key=lambda x: x["median_us"])
        e = entries[key]
        assert (e["path"], e["config"]) == (fastest["path"], fastest["config"]), key
        assert (r["auto_path"], r["config"]) == (e["path"], e["config"]), key
        made = {(p, json.dumps(c, sort_keys=True)) for o, b, via, p, c in planned
                if (o, b, via) == (*key, "auto")}
        assert made == {(e["path"], json.dumps(e["config"], sort_keys=True))}, (key, made)
        ran += 1
    assert ran >= 1


def test_auto_vs_fastest_compares_auto_rows_with_the_fastest_of_their_shape():
    base = dict(op="sparse_mla_decode", preset="DSV32", B=64, N=1, H=128, L=32768, K=2048,
                kv_format="fp8_ds_mla", table_len=32768, tp=1, status="ok")
    cfg = {"block_h": 32}
    rows = [dict(base, backend="torch", path="triton", median_us=10.0, config=cfg),
            dict(base, backend="torch", path="torch", median_us=30.0, config={}),
            dict(base, backend="torch", path="auto", median_us=10.5, config=cfg, auto_path="triton"),
            dict(base, backend="jax", path="pallas", median_us=20.0, config=cfg),
            dict(base, backend="jax", path="xla", median_us=12.0, config={}),
            dict(base, backend="jax", path="auto", median_us=20.5, config=cfg, auto_path="pallas"),
            dict(base, backend="jax", path="auto", B=1, median_us=1.0, config={}, auto_path="xla")]
    got = {a["backend"]: a for a in report.auto_vs_fastest(rows)}
    assert set(got) == {"torch", "jax"}                 # the B=1 auto row has no row to compare
    assert got["torch"]["agrees"] and got["torch"]["fastest_us"] == 10.0
    assert not got["jax"]["agrees"] and got["jax"]["fastest_path"] == "xla"
    assert got["jax"]["auto_path"] == "pallas" and got["jax"]["fastest_config"] == {}


def test_topk_path_vs_path_allows_only_subulp_swaps(monkeypatch):
    """Large shapes are checked path-vs-path; rows whose sets differ are then checked against the
    reference logits of that request: a sub-ulp swap at the threshold passes, a real one fails."""
    from types import SimpleNamespace

    from bench import checks

    logits = np.array([[[5.0, 4.0, 3.0, 3.0 + 1e-12, 1.0, -np.inf]]])       # [1, N=1, W=6]
    monkeypatch.setattr(checks, "indexer_slice", lambda inp, s, b, window=0: {})
    monkeypatch.setattr(checks.reference, "indexer_logits", lambda **kw: logits)
    chk = checks.Checker.__new__(checks.Checker)
    chk.inp = SimpleNamespace(sets=[{}])
    base = np.array([[[0, 1, 3]]])
    ok, msg = chk._differing_rows_within_spec(np.array([[[0, 1, 2]]]), base, 3, "differs")
    assert ok and "sub-ulp" in msg
    ok, msg = chk._differing_rows_within_spec(np.array([[[0, 1, 4]]]), base, 3, "differs")
    assert not ok and "request 0, this path" in msg


def test_compat_only_dry_run_rows(tmp_path, monkeypatch, capsys):
    """``python -m bench --compat-only --dry-run``: the compat call and the native call timed on
    the same inputs (the two-cache FlashMLA row here: the lightest), ratio reported, JSON written."""
    from bench.__main__ import main
    from bench import compat_rows as bench_compat
    monkeypatch.setattr(bench_compat, "ROW_NAMES", ("model1 + extra",))
    assert main(["--compat-only", "--dry-run", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "model1 + extra" in text and "ratio=" in text
    doc = json.loads(next(tmp_path.glob("bench_dry_compat_*.json")).read_text())
    (row,) = doc["compat_rows"]
    assert row["layout"] == "model1 + extra" and row["ratio"] > 0
    assert {"native_us", "compat_us"} <= set(row) and "merge_us" not in row   # one combine, no merge launch


def test_compat_v32_strided_row_times_the_native_op_on_the_same_pages(monkeypatch):
    """The ``v32 strided`` compat row: the native op is timed on the compat call's own padded
    pages (no contiguous copy), both calls checked against each other first."""
    from bench import compat_rows as bench_compat
    seen = []
    import torch_impl
    real = torch_impl.sparse_mla_decode

    def spy(q, kv_cache, *a, **kw):
        seen.append(kv_cache.is_contiguous())
        return real(q, kv_cache, *a, **kw)

    monkeypatch.setattr(torch_impl, "sparse_mla_decode", spy)
    (row,) = bench_compat.rows((1,), device="cpu", only=("v32 strided",))
    assert row["layout"] == "v32 strided" and row["native_cache"].startswith("strided (in place")
    assert seen and not any(seen) and row["ratio"] > 0


def test_indexer_sweep_ws_variants():
    """``python -m bench.indexer_sweep --ws``: today's Gluon kernel first (every check is
    against it), then the warp-specialised kernel's variants, each a valid logits config that
    stays ``gluon_ws`` on an H200 for the bench's shapes; ``--aot`` compiles each variant's two
    fused-histogram launches (N 1, N 2), split-count variants sharing one compile."""
    pytest.importorskip("triton")
    from bench import indexer_sweep as sw
    from kernels import hardware
    from kernels.indexer.triton import IndexerLogitsConfig, resolve_kernel
    h200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132,
                               smem_per_block=hardware.smem_limit((9, 0)))
    assert sw.WS_VARIANTS[0] == "gluon" and set(sw.WS_VARIANTS) <= set(sw.VARIANTS)
    for name in sw.WS_VARIANTS[1:]:
        cfg = IndexerLogitsConfig(**sw.VARIANTS[name])
        for N in (1, 2):
            assert resolve_kernel(cfg, h200, "fp8_indexer", N, 64, 128, 64).kernel == "gluon_ws"
        specs = sw._gluon_aot_specs(name)
        assert [s.label for s in specs] == [f"{name} N1", f"{name} N2"]
        assert all(s.constexprs["CONSUMERS"] == cfg.ws_consumers for s in specs)
    same = [{k: v for k, v in vars(s).items() if k != "label"} for s in
            sw._gluon_aot_specs("gluon_ws") + sw._gluon_aot_specs("gluon_ws_s2")]
    assert same[:2] == same[2:]


def test_indexer_sweep_ws_constants():
    """A variant of :data:`bench.indexer_sweep.WS_CONSTANTS` (``gluon_ws_hatom``: the fused
    histogram as one atomic a key) sets its ``gluon_ws`` module constant while it runs and the
    next variant finds the module's value again; its AOT specs carry the constant."""
    pytest.importorskip("triton")
    from bench import indexer_sweep as sw
    from kernels.indexer import gluon_ws
    default = gluon_ws.HIST_ATOMIC
    try:
        assert sw._ws_constants("gluon_ws_hatom") == {"HIST_ATOMIC": 1}
        assert gluon_ws.HIST_ATOMIC == 1
        assert sw._ws_constants("gluon_ws") == {"HIST_ATOMIC": default}
        assert gluon_ws.HIST_ATOMIC == default
        assert sw._ws_constants("gluon") == {}           # a kernel that reads none of them
    finally:
        gluon_ws.HIST_ATOMIC = default
    assert [s.constexprs["HIST_ATOMIC"] for s in sw._gluon_aot_specs("gluon_ws_hatom")] == [1, 1]
    assert [s.constexprs["HIST_ATOMIC"] for s in sw._gluon_aot_specs("gluon_ws")] == [default] * 2


def test_indexer_sweep_row_timeout_saves_and_exits(tmp_path):
    """``--row-timeout``: a row still running after the limit (a hung kernel) leaves the rows so
    far in the JSON with the hung row named, and the process exits 124 instead of holding the
    GPU call until its own limit."""
    import subprocess
    import sys
    out = tmp_path / "rows.json"
    code = ("import json, time\n"
            "from bench import indexer_sweep as sw\n"
            "rows, meta = [{'shape': 'a', 'variant': 'gluon'}], {}\n"
            f"save = lambda r, m: open({str(out)!r}, 'w').write(json.dumps(dict(m, rows=r)))\n"
            "sw._watchdog(0.3, 'b gluon_ws', rows, meta, save)\n"
            "time.sleep(30)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 124, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["hung"].startswith("b gluon_ws: no result after") and len(doc["rows"]) == 1


def test_indexer_sweep_ws_isolates_each_row(tmp_path, monkeypatch):
    """``--ws`` runs each (shape, variant) row in its own child process: a child that faults
    (exit status, CUDA's message on stderr) or hangs (killed after ``--row-timeout`` plus the
    slack) leaves an error row with the row's usual keys and the sweep goes on with the next
    variant; the children's rows and device description reach the same JSON document as
    before (rows, variants, shapes, partial, command), ``hung`` naming the hung row."""
    import sys
    from bench import indexer_sweep as sw
    code = ("import json, sys, time\n"
            "doc, name = sys.argv[1], sys.argv[2]\n"
            "if name == 'gluon_ws_c1':\n"
            "    sys.stderr.write('torch.AcceleratorError: CUDA error: an illegal memory access "
            "was encountered\\n'); sys.exit(1)\n"
            "if name == 'gluon_ws_c3':\n"
            "    time.sleep(60)\n"
            "row = dict(shape='v32_b64_l64k', variant=name, logits_us=1.0, error=None)\n"
            "json.dump(dict(meta=dict(gpu='fake'), rows=[row]), open(doc, 'w'))\n")
    calls = []

    def fake_cmd(sname, name, doc_path, base_file, row_timeout, first, dry, unguarded):
        calls.append((name, first, os.path.basename(base_file), unguarded))
        return [sys.executable, "-c", code, doc_path, name]

    monkeypatch.setattr(sw, "_child_cmd", fake_cmd)
    monkeypatch.setattr(sw, "CHILD_SLACK_S", 1.0)
    out = tmp_path / "sweep.json"
    sw.main(["--ws", "--shape", "v32_b64_l64k", "--row-timeout", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert {"date", "command", "elapsed_s", "partial", "variants", "shapes", "rows"} <= set(doc)
    assert doc["partial"] is False and doc["gpu"] == "fake"
    assert [r["variant"] for r in doc["rows"]] == list(sw.WS_VARIANTS)
    assert [c[0] for c in calls] == list(sw.WS_VARIANTS)
    assert {c[1] for c in calls} == {"gluon"} and {c[2] for c in calls} == {"base_v32_b64_l64k.pt"}
    by = {r["variant"]: r for r in doc["rows"]}
    c1, c3 = by["gluon_ws_c1"], by["gluon_ws_c3"]
    for r in (c1, c3):
        assert {"shape", "preset", "B", "N", "L", "table_len", "topk", "config", "error",
                "wall_s"} <= set(r)
        assert (r["B"], r["L"], r["table_len"], r["topk"]) == (64, 65536, 65536, 2048)
    assert c1["config"]["ws_consumers"] == 1
    assert "exit status 1" in c1["error"] and "illegal memory access" in c1["error"]
    assert "killed after" in c3["error"] and "gluon_ws_c3" in doc["hung"]
    assert all(by[n]["error"] is None for n in ("gluon", "gluon_ws", "gluon_ws_smem", "gluon_ws_s8"))


def test_targets_report_on_the_committed_results(tmp_path):
    """``bench.targets`` on the committed 2026-12-05 H200 targets files (torch and jax), against
    the 2026-12-04 sparse-MLA file: every absolute target row is found, the statuses follow the
    numbers (B 64 H 128 146.7 us > 125: missed; H 64 94.6 <= 100: met; the latent row 125.5 <=
    130: met, 631.2 before), the relative and ratio targets are computed from the two files' rows
    (N 2 / N 1 = 1.87 > 1.6; Pallas B 64 H 128 3.13x > 1.25x), and the layer ratios are read off
    both stacks' rows (V4 B 1 torch glue 21.7 % > 15 %; V3.2 B 64 5.9 %: met)."""
    import json as _json
    from bench import targets
    res = Path(__file__).resolve().parents[1] / "bench" / "results"
    out = tmp_path / "t.json"
    assert targets.main([str(res / "bench_h200_targets_torch_20261205.json"),
                         str(res / "bench_h200_targets_jax_20261205.json"), "--against",
                         str(res / "bench_h200_targets_mla_20261204.json"), "--json", str(out)]) == 0
    lines = _json.loads(out.read_text())["lines"]
    absolute = [ln for ln in lines if ln["metric"] == "median_us"]
    assert len(absolute) == len(targets.ABSOLUTE) and all(ln["status"] != "absent" for ln in absolute)
    by = {(ln["target"], ln["stack"], ln["metric"]): ln for ln in lines}
    h128 = by[("mla DSV32 B64 N1 H128 L32768 fp8_ds_mla", "torch/triton", "median_us")]
    assert h128["status"] == "missed" and h128["value"] == pytest.approx(146.7, abs=0.05)
    assert by[("mla DSV32 B64 N1 H64 L32768 fp8_ds_mla", "torch/triton", "median_us")]["status"] == "met"
    lat = by[("mla DSV32 B64 N1 H128 L32768 latent", "torch/triton", "median_us")]
    assert lat["status"] == "met" and lat["before"] == pytest.approx(631.2, abs=0.05)
    n2 = [ln for ln in lines if ln["metric"] == "ratio" and "N2" in ln["target"]][0]
    assert n2["status"] == "missed" and n2["value"] == pytest.approx(1.87, abs=0.01)
    pal = by[("mla DSV32 B64 N1 H128 L32768 fp8_ds_mla", "jax/pallas", "/ torch/triton")]
    assert pal["status"] == "missed" and pal["value"] == pytest.approx(3.13, abs=0.01)
    glue = {ln["target"].split(" (")[0]: ln for ln in lines
            if ln["metric"] == "glue_frac" and ln["stack"] == "torch/triton"}
    assert glue["layer DSV4_FLASH B1 N1 fp8_model1"]["status"] == "missed"
    assert glue["layer DSV32 B64 N1 fp8_ds_mla"]["status"] == "met"


def test_recorded_env_takes_every_dsa_switch(monkeypatch):
    """A result file's ``env``: the listed variables and any ``DSA_*`` switch that is set (the
    unfused top-k's split count was run unrecorded once), empty values left out."""
    from bench.runner import recorded_env
    for k in list(__import__("os").environ):
        if k.startswith(("DSA_", "TF_CPP_")) or k in ("XLA_FLAGS", "TRITON_INTERPRET"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("DSA_TOPK_UNFUSED_PER_SM", "4")
    monkeypatch.setenv("DSA_TOPK_PART_PRE", "")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")
    monkeypatch.setenv("TF_CPP_VMODULE", "command_buffer_conversion_pass=2")
    monkeypatch.setenv("DSAX_OTHER", "1")
    assert recorded_env() == {"DSA_TOPK_UNFUSED_PER_SM": "4",
                              "TF_CPP_VMODULE": "command_buffer_conversion_pass=2",
                              "XLA_FLAGS": "--xla_gpu_enable_command_buffer="}


def test_xla_cmdbuf_log_summary(tmp_path, capsys):
    """bench.xla_cmdbuf reads command_buffer_conversion_pass's VLOG lines (the log prefix, then
    the pass's messages): per module its command buffers and their sizes, and the thunks it left
    out by the reason it names; the CLI prints one line a module and writes the JSON."""
    from bench import xla_cmdbuf
    pre = "I1207 20:41:00.123456   4242 command_buffer_conversion_pass.cc:{}] "
    log = "\n".join([
        "unrelated line",
        pre.format(560) + "Module jit_run CommandBufferConfig: enabled_commands: [FUSION, CUBLAS], "
                          "enabled_collectives: [ALLCOLLECTIVES]",
        pre.format(420) + "Creating command buffer thunk command_buffer_3 with the following thunks: "
                          "fusion.1, fusion.2, cache_write_fp8_model1",
        pre.format(380) + "Thunk kind kKernel is not lowered to command buffer because command size is "
                          "less than the min graph size",
        pre.format(380) + "Thunk kind kKernel is not lowered to command buffer because command size is "
                          "less than the min graph size",
        pre.format(300) + "Thunk kind kGemm lowering is not enabled by the user for type CUBLASLT",
        pre.format(120) + "Removed command buffer support for CUSTOM_CALL as it's not supported with "
                          "gpu toolkit version 12.2.0 and driver version 12.2.0. This might ...",
        pre.format(560) + "Module jit_copy CommandBufferConfig: enabled_commands: [FUSION]",
        pre.format(200) + "Unsupported thunk kind: kHostExecuteStart",
        pre.format(564) + "Creating command buffer thunk with the following thunks: "     # jax 0.11.2's form
                          "fusion.7, , copy.2",
        pre.format(330) + "Collective thunk kind kAllReduce is not enabled by the collectives filter",
        pre.format(260) + "WhileThunk is not convertible to command buffers because its body contains "
                          "loop-dependent DynamicSliceFusionV2Thunk and the while loop will not be unrolled",
        pre.format(280) + "Skipping RaggedAllToAll Command Buffer conversion: Operation requires "
                          "multi-host communication (num_local_devices=8)\r",
    ])
    s = xla_cmdbuf.summarize(log)
    assert list(s) == ["jit_run", "jit_copy"]
    assert s["jit_run"]["command_buffers"] == [3] and s["jit_run"]["thunks_inside"] == 3
    assert s["jit_run"]["config"].startswith("enabled_commands: [FUSION, CUBLAS]")
    assert s["jit_run"]["left_out"] == {"below the min graph size": {"kKernel": 2},
                                        "type CUBLASLT not enabled": {"kGemm": 1}}
    assert s["jit_run"]["removed_commands"] == []
    assert s["jit_copy"] == {
        "config": "enabled_commands: [FUSION]", "removed_commands": ["CUSTOM_CALL"],
        "command_buffers": [3], "thunks_inside": 3,     # an unnamed thunk counts
        "left_out": {"kind not supported": {"kHostExecuteStart": 1},
                     "not in the collectives filter": {"kAllReduce": 1},
                     "its body contains loop-dependent DynamicSliceFusionV2Thunk and the while loop "
                     "will not be unrolled": {"WhileThunk": 1},
                     "Operation requires multi-host communication (num_local_devices=8)":
                         {"RaggedAllToAll": 1}}}
    p = tmp_path / "x.log"
    p.write_text(log)
    assert xla_cmdbuf.main([str(p), "--module", "run", "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == ["jit_run: 1 command buffers, 3 thunks inside (sizes [3]); left out: "
                                "below the min graph size: kKernel x2; type CUBLASLT not enabled: kGemm x1"]
    assert json.loads((tmp_path / "s.json").read_text()) == {"jit_run": s["jit_run"]}
    assert xla_cmdbuf.main([str(p), "--json", str(tmp_path / "new" / "dir" / "s.json")]) == 0
    assert set(json.loads((tmp_path / "new" / "dir" / "s.json").read_text())) == {"jit_run", "jit_copy"}
    capsys.readouterr()
    for argv, message in [([str(tmp_path / "missing.log")], "log: cannot read"),
                          ([str(p), "--json", str(tmp_path)], "argument --json: expected a writable file"),
                          ([str(p), "--json", ""], "argument --json: expected a writable file, got '': an empty path"),
                          ([str(p), "--module", "nomatch"],
                           "argument --module: no module name holds 'nomatch'; the log has jit_run, jit_copy")]:
        with pytest.raises(SystemExit) as e:
            xla_cmdbuf.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err, argv


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="the CPU machine's set-up (on a GPU the kernels compile)")
def test_cli_sets_the_interpreters_before_its_checks_import_the_kernels(tmp_path):
    """``python -m bench --dry-run`` in a shell without ``TRITON_INTERPRET``: the argument
    checks import the kernel modules (the bad-environment check reads their switches), so the
    interpreters must be set first, or the Triton kernels load compiled and every CPU row
    failed (found by a new-user trial, 2026-12-07). A child process, the variable unset."""
    import subprocess
    import sys
    code = ("import os\n"
            "from bench.__main__ import parse\n"
            f"parse(['--dry-run', '--no-plot', '--no-progress', '--out', {str(tmp_path)!r}])\n"
            "from kernels.topk import triton as kt\n"
            "print(os.environ.get('TRITON_INTERPRET'), type(kt._radix_topk_kernel).__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "InterpretedFunction"], proc.stdout
