"""Every launch config the torch_impl launchers can choose compiles for sm_120 and sm_90 and fits
the shared memory per block of that GPU (kernels.hardware.SMEM_PER_BLOCK). sm_120 (the target)
is checked everywhere; sm_90 on GPU machines or with ``DSA_AOT_SM90=1`` (tests/conftest.py).

No GPU is needed: ``kernels._triton_aot`` compiles with Triton's bundled ptxas for
``GPUTarget("cuda", cc, 32)`` in a subprocess without ``TRITON_INTERPRET`` (this test process
has it set on CPU machines, and ``@triton.jit`` would return interpreter objects).

The sm_120 compiles with the GPU image's Triton go through a record of earlier compiles
(``tests/aot_record/``, keyed by Triton's own cache key of each spec; ``_compiled`` says how and
why; ``make aot-record`` rewrites it).

Registry: :data:`LAUNCHERS` maps a launcher name to a function ``smem_class -> [LaunchSpec]``
listing every (kernel, signature, constexprs, num_warps, num_stages) that launcher can launch on
a GPU of that shared-memory class (``kernels.sparse_mla.configs.smem_class``), from the module
beside each kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from kernels import _triton_aot as _aot
from kernels import hardware
from kernels.cache_write import triton as _cache_write
from kernels.indexer import triton_aot as _indexer_aot
from kernels.layer_prep import triton as _layer_prep
from kernels.linear import triton as _linear
from kernels.sparse_mla import configs, triton_launch as _sparse_mla
from kernels.topk import triton_aot as _topk_aot

# launcher name -> specs(smem_class); each lives beside its kernel.
LAUNCHERS = {
    "sparse_mla_decode": _sparse_mla.aot_specs,
    "indexer_logits": _indexer_aot.aot_specs,
    "indexer_topk": _topk_aot.aot_specs,
    "cache_write": _cache_write.aot_specs,
    "linear": _linear.aot_specs,
    "layer_prep": _layer_prep.aot_specs,
}

# (cc as an int for GPUTarget, compute capability tuple for the smem table)
TARGETS = {120: (12, 0), 90: (9, 0)}

# The GPU image's Triton (the Makefile unpacks it into .venv/triton-gpu-image on machines without
# a GPU): sm_120 fit is also checked with the compiler the GPU runs, not only the one installed.
GPU_IMAGE_TRITON = "3.6.0"
_GPU_IMAGE_DIR = Path(os.environ.get("DSA_TRITON_GPU_IMAGE_DIR")
                      or Path(__file__).resolve().parents[1] / ".venv" / "triton-gpu-image")


def _gpu_image_triton_is_other() -> bool:
    """Whether the installed Triton is another version than the GPU image's."""
    import triton
    return triton.__version__.split("+")[0] != GPU_IMAGE_TRITON


def _gpu_image_triton() -> str | None:
    """The folder holding the GPU image's Triton, or None when the installed Triton is that
    version (a GPU machine) and the second compile would repeat the first."""
    if not _gpu_image_triton_is_other():
        return None
    if not (_GPU_IMAGE_DIR / "triton" / "__init__.py").exists():
        pytest.fail(f"Triton {GPU_IMAGE_TRITON} (the GPU image's) is not unpacked in "
                    f"{_GPU_IMAGE_DIR}: run `make env` (the Makefile installs it there on "
                    f"machines without a GPU), or point DSA_TRITON_GPU_IMAGE_DIR at a folder "
                    f"holding it (pip install --no-deps --target DIR triton=={GPU_IMAGE_TRITON})")
    return str(_GPU_IMAGE_DIR)


# sm_90 (the H200; not the target) is checked on GPU machines or with DSA_AOT_SM90=1
# (tests/conftest.py); sm_120 always.
CCS = [pytest.param(cc, marks=pytest.mark.sm90, id=f"sm_{cc}") if cc == 90
       else pytest.param(cc, id=f"sm_{cc}") for cc in sorted(TARGETS)]


# The sm_120 compiles with the GPU image's Triton read the results of earlier compiles of the same
# spec from tests/aot_record/<launcher>_sm120.json, keyed by Triton's own cache key of the spec
# (kernels._triton_aot.spec_key: the kernel's source and the @jit functions and constexpr globals
# it names, the constexprs, the Triton version and build, ptxas, the options) together with a
# digest of every file under kernels/ (which covers what a kernel reaches that Triton's key does
# not: compile_specs_cached); a spec whose key is not there is compiled. So after any change
# under kernels/ every spec compiles until `make aot-record` rewrites the record (on CI's Python,
# 3.11: the Triton wheel, hence the key, differs by Python version). Compiling every spec took
# ~350 s of the ~800-920 s CI pytest run on 2 cores (tests/TEST_TIME.md, run CN).
# DSA_AOT_RECORD: unset or "read" (default), "write" (compile every spec and rewrite the record:
# `make aot-record`), "off" (compile every spec, bypassing Triton's on-disk cache too; leave the
# record). test_sm120_record_matches_a_fresh_compile compiles one recorded spec of each launcher
# afresh every run and compares: a spot check, not a proof of every entry.
AOT_RECORD_DIR = Path(__file__).resolve().parent / "aot_record"
AOT_RECORD_ENV = "DSA_AOT_RECORD"
_RECORD_STATS: dict[str, dict] = {}


def _record_mode() -> str:
    mode = os.environ.get(AOT_RECORD_ENV, "") or "read"
    if mode not in ("read", "write", "off"):
        raise ValueError(f"{AOT_RECORD_ENV}: expected 'read', 'write', 'off' or unset, got {mode!r}")
    return mode


def _specs(cc: int, launcher: str) -> list:
    return LAUNCHERS[launcher](configs.smem_class(hardware.smem_limit(TARGETS[cc])))


@functools.lru_cache(maxsize=None)
def _compiled(cc: int, launcher: str, triton_path: str | None = None) -> tuple:
    """Every spec of ``launcher`` for ``sm_<cc>`` compiled (with ``triton_path``'s Triton, default
    the installed one); sm_120 with the GPU image's Triton through the record (above)."""
    specs = _specs(cc, launcher)
    if cc != 120 or triton_path is None:
        return tuple(_aot.compile_specs(specs, (cc,), triton_path=triton_path))
    mode = _record_mode()
    if mode == "off":
        return tuple(_aot.compile_specs(specs, (cc,), triton_path=triton_path, always_compile=True))
    res, stats = _aot.compile_specs_cached(specs, (cc,), AOT_RECORD_DIR / f"{launcher}_sm120.json",
                                           triton_path, write=mode == "write")
    _RECORD_STATS[launcher] = stats
    return tuple(res)


@pytest.mark.slow
@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_every_config_fits_shared_memory(launcher, cc):
    """Every config compiled with the installed Triton. For sm_120 on a machine whose Triton is
    not the GPU image's (CPU CI: 3.9 against 3.6.0) only with DSA_AOT_INSTALLED=1: there the
    sm_120 fit is checked with the GPU image's Triton (the next test), and compiling every spec
    twice took ~700 s of a 1,815 s CI pytest run on a 2-core AMD EPYC (tests/TEST_TIME.md, run G)."""
    if cc == 120 and _gpu_image_triton_is_other() and os.environ.get("DSA_AOT_INSTALLED", "") in ("", "0"):
        pytest.skip(f"sm_120 fit checked with the GPU image's Triton {GPU_IMAGE_TRITON} "
                    f"(test_every_config_fits_sm120_with_the_gpu_image_triton); "
                    f"DSA_AOT_INSTALLED=1 compiles with the installed Triton as well")
    limit = hardware.smem_limit(TARGETS[cc])
    _check_fit(_compiled(cc, launcher), cc, limit)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_every_config_fits_sm120_with_the_gpu_image_triton(launcher):
    """The same sm_120 check compiled with the GPU image's Triton (GPU_IMAGE_TRITON): the
    registers, spills and shared memory the GPU's compiler gives, where they differ from the
    installed one's (a Gluon or layout change between versions)."""
    path = _gpu_image_triton()
    if path is None:
        pytest.skip(f"the installed Triton is {GPU_IMAGE_TRITON}: test_every_config_fits_shared_memory "
                    f"already compiled with it")
    results = _compiled(120, launcher, path)
    assert {r.get("triton") for r in results if "error" not in r} <= {GPU_IMAGE_TRITON}
    _check_fit(results, 120, hardware.smem_limit(TARGETS[120]))
    stats = _RECORD_STATS.get(launcher)
    if stats and stats["bypassed"]:
        warnings.warn(f"{launcher}: tests/aot_record not read ({', '.join(stats['bypassed'])} set: "
                      f"Triton's key does not cover it); every sm_120 spec was compiled", stacklevel=1)
    elif stats and stats["compiled"] and _record_mode() == "read":
        warnings.warn(f"{launcher}: {stats['compiled']} of {stats['specs']} sm_120 specs are not in "
                      f"tests/aot_record and were compiled here (a file under kernels/ changed since "
                      f"the record was written, or this Python's Triton {GPU_IMAGE_TRITON} wheel is "
                      f"not the one it was written with); `make aot-record` on CI's Python (3.11) "
                      f"rewrites it", stacklevel=1)


@pytest.mark.slow
def test_sm120_split_plan_occupancy_within_the_compile_reports():
    """For every split-kernel config the sm_120 launcher can choose (each of the AOT variants'
    configs, both dot operand sizes), the CTAs per SM the split plan assumes
    (``configs.sparse_mla_ctas_per_sm`` with the launch's operand bytes, what
    ``triton_launch._split_plan`` passes) are no more than the sm_120 compile report allows
    (registers and shared memory: ``kernels._triton_aot.occupancy``): more would plan programs
    the SM cannot hold at once. (The fp32-dot 16 x 16 tile takes 73,728 B: one CTA an SM; the
    2-byte estimate said two.)"""
    path = _gpu_image_triton()
    by_label = {r["label"]: r for r in _compiled(120, "sparse_mla_decode", path)}
    limit = hardware.smem_limit(TARGETS[120])
    checked = 0
    for kv_format, d_qk, q_dtype, final in _sparse_mla.AOT_VARIANTS:
        kv_dtype = q_dtype if kv_format == "latent" else torch.uint8
        dot = _sparse_mla.dot_dtype(q_dtype, kv_dtype, kv_format)
        nbytes = 4 if dot == "float32" else 2
        for cfg in configs.SPARSE_MLA_SPACE[(configs.smem_class(limit), nbytes)]:
            if cfg.kernel != "triton":
                continue
            for has_bt in (True, False):
                r = by_label[_sparse_mla.split_spec(kv_format, d_qk, q_dtype, final, cfg,
                                                    has_bt=has_bt).label]
                occ = _aot.occupancy(r["registers"], r["shared"], cfg.num_warps, 120)["ctas"]
                assert configs.sparse_mla_ctas_per_sm(cfg, limit, operand_bytes=nbytes) <= max(1, occ), \
                    (r["label"], r["registers"], r["shared"], occ)
                checked += 1
    # every split-kernel launch of the sm_120 specs was checked
    assert checked == sum(s.kernel == "_sparse_mla_split_kernel" for s in _specs(120, "sparse_mla_decode"))


@pytest.mark.slow
def test_sm120_linear_smem_model_equals_the_compile_reports():
    """``LinearConfig.smem_bytes`` (what ``kernels.linear.configs.ctas_per_sm`` divides the SM's
    shared memory by for the split-K plan) equals the sm_120 compile report's shared memory for
    every ``_linear_kernel`` launch of the sm_120 space (each config with each operand variant:
    16-bit weights, fp32 weights with fp32 or 16-bit x, the FMA and tf32x3 dots)."""
    from kernels.linear import configs as lcfg
    nbytes = {"*bf16": 2, "*fp16": 2, "*fp32": 4}
    seen = set()
    for spec, r in zip(_specs(120, "linear"), _compiled(120, "linear", _gpu_image_triton())):
        if spec.kernel != "_linear_kernel":
            continue
        ce = spec.constexprs
        cfg = lcfg.LinearConfig(ce["BLOCK_N"], ce["BLOCK_M"], ce["BLOCK_K"], spec.num_warps,
                                spec.num_stages, ce["F32_DOT"])
        w_bytes = 4 if ce["FP32_W"] else 2
        assert cfg.smem_bytes(w_bytes, nbytes[spec.signature["x_ptr"]], False) == r["shared"], r["label"]
        seen.add((w_bytes, cfg))
    # every config of the sm_120 space was among them
    small = configs.smem_class(hardware.smem_limit(TARGETS[120]))
    assert seen == {(w_bytes, cfg) for (cls, w_bytes, _), space in lcfg.LINEAR_SPACE.items()
                    if cls == small for cfg in space}


def _tree_id() -> str:
    """The checked-out tree's git id ('' outside a git checkout): a different recorded spec is
    compiled afresh at each commit (test_sm120_record_matches_a_fresh_compile)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_sm120_record_matches_a_fresh_compile(launcher):
    """One recorded sm_120 result of ``launcher`` (tests/aot_record), picked by the checked-out
    tree's id and the record's bytes (so another is picked at each commit and after any edit of
    the record), equals a fresh compile of its spec with the GPU image's Triton (Triton's
    on-disk cache bypassed): the same shared memory, registers, spills and stack. A spot check
    of one entry a run, not of every entry: `make aot-record` recompiles them all."""
    path = _gpu_image_triton()
    if path is None or _record_mode() != "read":
        pytest.skip("the record is read only where the sm_120 check compiles with the GPU image's "
                    f"Triton and {AOT_RECORD_ENV} is unset or 'read'")
    results = _compiled(120, launcher, path)
    recorded = [i for i, r in enumerate(results) if r["cached"]]
    if not recorded:
        pytest.skip(f"{launcher}: no spec's result is recorded (every spec was compiled here)")
    salt = _tree_id() + hashlib.sha256((AOT_RECORD_DIR / f"{launcher}_sm120.json").read_bytes()).hexdigest()
    i = min(recorded, key=lambda i: hashlib.sha256((salt + results[i]["key"]).encode()).hexdigest())
    (fresh,) = _aot.compile_specs([_specs(120, launcher)[i]], (120,), triton_path=path,
                                  always_compile=True)
    assert "error" not in fresh, fresh
    for f in _aot.CACHED_FIELDS:
        assert fresh[f] == results[i][f], (results[i]["label"], f, fresh[f], results[i][f])


def _check_fit(results, cc: int, limit: int) -> None:
    assert results, "no launch specs"
    errors = [r for r in results if "error" in r]
    assert not errors, "compile failed: " + "; ".join(f"{r['label']}: {r['error']}" for r in errors[:3])
    too_big = [r for r in results if r["shared"] > limit]
    assert not too_big, (f"sm_{cc} allows {limit} B of shared memory per block; "
                         + "; ".join(f"{r['label']} needs {r['shared']}" for r in too_big))


@pytest.mark.slow
@pytest.mark.parametrize("cc", CCS)
def test_split_pass_a_smem_buffer_is_the_only_shared_memory(cc):
    """The Gluon split pass A (``kernels.topk.gluon_hist``) adds to its histogram through inline
    PTX at ``global_smem + HIST_SMEM_OFFSET``: correct only while its one shared buffer is all
    the shared memory the kernel takes (no reduction or layout conversion through shared
    memory), so Triton's allocator puts it at 0. Every smem launch of ``SPLIT_HIST_SPACE``,
    compiled with the GPU image's Triton (the installed one for sm_90; the default's PDL twin
    too), takes exactly ``SMEM_WORDS * 4`` bytes."""
    from kernels.topk import gluon_hist
    from kernels.topk.triton import SPLIT_HIST_SPACE
    path = _gpu_image_triton() if cc == 120 else None
    res = [r for r in _compiled(cc, "indexer_topk", path) if " split hist smem " in r["label"]]
    assert (len([r for r in res if not r["label"].endswith(" pdl")])
            == sum(form == "smem" for _, _, form in SPLIT_HIST_SPACE))
    assert gluon_hist.HIST_SMEM_OFFSET.value == 0
    for r in res:
        assert "error" not in r, r.get("error")
        assert r["shared"] == gluon_hist.SMEM_WORDS.value * 4, (r["label"], r["shared"])


@pytest.mark.slow
@pytest.mark.parametrize("cc", CCS)
def test_split_pass_b_smem_buffer_is_the_only_shared_memory(cc):
    """The Gluon split pass B (``kernels.topk.gluon_scatter``) stages each block's selected keys
    through inline PTX at ``global_smem + STAGE_SMEM_OFFSET``: correct only while its one shared
    buffer (``2 x BLOCK`` words) is all the shared memory the kernel takes (every reduction and
    scan inside a warp), so Triton's allocator puts it at 0. Every smem launch (each (BLOCK,
    warps) of ``SCATTER_SMEM_SPACE``, planning itself and after the part kernel; the PDL twin too),
    compiled with the GPU image's Triton, takes exactly that."""
    import re
    from kernels.topk import gluon_scatter
    from kernels.topk.triton import SCATTER_SMEM_SPACE
    path = _gpu_image_triton() if cc == 120 else None
    res = [r for r in _compiled(cc, "indexer_topk", path) if " scatter smem " in r["label"]]
    assert len([r for r in res if r["label"].endswith(" parts")]) == len(SCATTER_SMEM_SPACE)
    assert any(r["label"].endswith(" pdl") for r in res)
    assert gluon_scatter.STAGE_SMEM_OFFSET.value == 0
    for r in res:
        assert "error" not in r, r.get("error")
        block = int(re.search(r" block(\d+) ", r["label"]).group(1))
        assert r["shared"] == 2 * block * 4, (r["label"], r["shared"])


def test_aot_compile_one_kernel_without_gpu():
    """Fast check that AOT compilation works here (subprocess, TRITON_INTERPRET cleared): the
    heuristic's config for 64 heads on the fp8_ds_mla split kernel, for sm_120, reports a
    positive shared-memory size within the sm_120 limit."""
    limit = hardware.smem_limit((12, 0))
    cfg = configs.sparse_mla_heuristic(64, limit)
    specs = [s for s in _sparse_mla.aot_specs(configs.smem_class(limit))
             if s.label.startswith("split fp8_ds_mla D576 q=bfloat16 partial block table")
             and str(cfg) in s.label]
    assert len(specs) == 1
    (res,) = _aot.compile_specs(specs, (120,))
    assert "error" not in res, res.get("error")
    assert 0 < res["shared"] <= limit


def test_compile_specs_cached_records_reads_and_compiles_what_changed(tmp_path, monkeypatch):
    """``compile_specs_cached`` with two small specs: ``write`` compiles both and records them
    under their keys; a read takes both from the record (the same results, ``cached``); a
    spec whose config changed (another key) is compiled while the other is read; an entry no
    spec has any more is dropped at the next write; another digest of kernels/ reads nothing; a
    variable Triton's key misses (``TRITON_KERNEL_OVERRIDE``) neither reads nor writes it; a
    malformed record is named."""
    record = tmp_path / "rec.json"
    specs = _cache_write.aot_specs(configs.smem_class(hardware.smem_limit((12, 0))))[:2]
    path = _gpu_image_triton()
    res, stats = _aot.compile_specs_cached(specs, (120,), record, path, write=True)
    assert stats == {"specs": 2, "recorded": 0, "compiled": 2, "bypassed": []}
    assert not any(r["cached"] for r in res)
    entries = json.loads(record.read_text())["entries"]
    assert set(entries) == {r["key"] for r in res} and len(entries) == 2
    again, stats = _aot.compile_specs_cached(specs, (120,), record, path)
    assert stats == {"specs": 2, "recorded": 2, "compiled": 0, "bypassed": []}
    for a, b in zip(res, again):
        assert {k: a[k] for k in ("label", "key", *_aot.CACHED_FIELDS)} == \
               {k: b[k] for k in ("label", "key", *_aot.CACHED_FIELDS)}
    changed = [specs[0], dataclasses.replace(specs[1], num_warps=specs[1].num_warps * 2)]
    mixed, stats = _aot.compile_specs_cached(changed, (120,), record, path)
    assert stats == {"specs": 2, "recorded": 1, "compiled": 1, "bypassed": []}
    assert mixed[0]["cached"] and not mixed[1]["cached"] and mixed[1]["key"] not in entries
    assert mixed[1]["num_warps"] == specs[1].num_warps * 2 and "error" not in mixed[1]
    _aot.compile_specs_cached(changed, (120,), record, path, write=True)
    assert set(json.loads(record.read_text())["entries"]) == {r["key"] for r in mixed}
    # any other file under kernels/ (another digest): nothing is read
    monkeypatch.setattr(_aot, "kernels_tree_digest", lambda: "another tree")
    _, stats = _aot.compile_specs_cached(changed, (120,), record, path)
    assert stats["recorded"] == 0 and stats["compiled"] == 2
    monkeypatch.undo()
    # a variable that changes the build outside Triton's key: neither read nor written
    monkeypatch.setenv("TRITON_KERNEL_OVERRIDE", "1")
    before = record.read_text()
    _, stats = _aot.compile_specs_cached(changed, (120,), record, path, write=True)
    assert stats["bypassed"] == ["TRITON_KERNEL_OVERRIDE"] and stats["recorded"] == 0
    assert record.read_text() == before
    monkeypatch.delenv("TRITON_KERNEL_OVERRIDE")
    record.write_text("{")
    with pytest.raises(ValueError, match=r"rec\.json: expected a compile record .*make aot-record"):
        _aot.compile_specs_cached(changed, (120,), record, path)


def test_gluon_ws_specs_listed_for_sm90_only():
    """The warp-specialised Gluon kernel (sm_90 only) is in the large class's AOT specs (so the
    sm90-marked compile test above compiles it), for both fp8 formats and the latent cache
    (bf16 and fp16), partial and final, with and without a block table; never in the small
    class's (sm_120). Latent launches pass the cache for all three pointers, in q's dtype."""
    large = [s for s in _sparse_mla.aot_specs("large") if s.kernel == "_sparse_mla_gluon_ws_kernel"]
    small = [s for s in _sparse_mla.aot_specs("small") if s.kernel == "_sparse_mla_gluon_ws_kernel"]
    assert not small
    labels = {s.label for s in large}
    for fmt in ("fp8_ds_mla", "fp8_model1", "latent"):
        for bt in ("block table", "slots"):
            assert f"gluon_ws x2 {fmt} q=bfloat16 partial {bt}" in labels
    for final, bt in (("final", "block table"), ("final", "slots")):
        assert f"gluon_ws x2 fp8_ds_mla q=bfloat16 {final} {bt}" in labels
        assert f"gluon_ws x2 latent q=bfloat16 {final} {bt}" in labels
    assert "gluon_ws x2 latent q=float16 partial slots" in labels
    assert all(s.num_warps == 8 and s.constexprs["NBUF"] == 2 for s in large)
    from kernels.sparse_mla import gluon_ws
    for s in large:
        latent = s.constexprs["KV_FORMAT"] == 0
        assert s.constexprs["PRODUCER_REGS"] == (gluon_ws.LATENT_PRODUCER_REGS if latent
                                                 else gluon_ws.PRODUCER_REGS)
        if latent:
            q = s.signature["q_ptr"]
            assert s.signature["kv_ptr"] == s.signature["kv16_ptr"] == s.signature["kv32_ptr"] == q
            assert s.constexprs["ROPE_DTYPE"] == {"*bf16": "bfloat16", "*fp16": "float16"}[q]
        assert s.constexprs["SIGNAL"] == (gluon_ws.LATENT_SIGNAL if latent else 0)
        assert s.constexprs["P_SMEM"] == (gluon_ws.LATENT_P_SMEM if latent else 0)


def test_gluon_sh_specs_listed_for_sm90_only():
    """The few-heads Gluon kernel (sm_90 only) is in the large class's AOT specs for each of its
    configs (8, 16 and 32 heads on wgmma N), both fp8 formats, partial and final, with and
    without a block table; never in the small class's (sm_120), never for a latent cache."""
    large = [s for s in _sparse_mla.aot_specs("large") if s.kernel == "_sparse_mla_gluon_sh_kernel"]
    small = [s for s in _sparse_mla.aot_specs("small") if s.kernel == "_sparse_mla_gluon_sh_kernel"]
    assert not small
    labels = {s.label for s in large}
    for cfg in (configs.SPARSE_MLA_GLUON_SH8, configs.SPARSE_MLA_GLUON_SH16,
                configs.SPARSE_MLA_GLUON_SH16W8, configs.SPARSE_MLA_GLUON_SH32):
        tag = f"gluon_sh h{cfg.block_h} w{cfg.num_warps} x1"
        for fmt in ("fp8_ds_mla", "fp8_model1"):
            for bt in ("block table", "slots"):
                assert f"{tag} {fmt} q=bfloat16 partial {bt}" in labels
        assert f"{tag} fp8_ds_mla q=bfloat16 final slots" in labels
    assert not [s for s in large if s.constexprs["KV_FORMAT"] == 0]
    assert all(s.constexprs["HN"] in (8, 16, 32) and s.num_warps in (4, 8) for s in large)


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_sh_compiles_without_spills_in_its_loop(tmp_path, monkeypatch):
    """The few-heads Gluon kernel for sm_90 with the GPU image's Triton, every config of the
    space, both fp8 formats, bf16 and fp16 q, partial and final: it fits the H200's shared
    memory; its block loop (the largest loop) holds no spill traffic (LDL / STL) and its wgmmas
    (k 16 each; fp8_ds_mla: 32 nope + 4 rope score, 32 value = 68; fp8_model1: 28 + 4 score,
    28 nope value + 4 rope value, 4 more for bf16 p's residual = 64 / 68); the 4-warp configs
    keep 2 CTAs
    an SM (registers and shared memory), as the split plan assumes
    (``configs.sparse_mla_ctas_per_sm``). Counts of 2026-12-05 in bench/NOTES.md."""
    specs = []
    for cfg in (configs.SPARSE_MLA_GLUON_SH8, configs.SPARSE_MLA_GLUON_SH16,
                configs.SPARSE_MLA_GLUON_SH16W8, configs.SPARSE_MLA_GLUON_SH32):
        for fmt in ("fp8_ds_mla", "fp8_model1"):
            for q_dtype, final in ((torch.bfloat16, False), (torch.float16, False),
                                   (torch.bfloat16, True)):
                specs.extend(_sparse_mla._gluon_specs(fmt, q_dtype, final, 1, "gluon_sh", cfg))
    path = _gpu_image_triton()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))   # a cached compile skips ptxas -v
    results = _aot.compile_specs(specs, (90,), sass=True, triton_path=path)
    _check_fit(results, 90, hardware.smem_limit(TARGETS[90]))
    for spec, r in zip(specs, results):
        loop = r["sass"]["loops"][-1] if r["sass"]["loops"] else r["sass"]["loop"]
        ops = loop["ops"]
        assert not ops.get("LDL") and not ops.get("STL"), (r["label"], ops)
        model1_fp16 = "fp8_model1" in r["label"] and "float16" in r["label"] and "bfloat16" not in r["label"]
        assert ops.get("HGMMA") == (64 if model1_fp16 else 68), (r["label"], ops.get("HGMMA"))
        if spec.num_warps == 4:
            occ = _aot.occupancy(r["registers"], r["shared"], 4, 90)
            assert occ["ctas"] >= 2, (r["label"], occ)
        cfg = configs.SparseMLAConfig(block_h=spec.constexprs["HN"], block_k=64,
                                      num_warps=spec.num_warps, num_stages=1, kernel="gluon_sh")
        assert configs.sparse_mla_ctas_per_sm(cfg, hardware.smem_limit(TARGETS[90])) <= \
            max(1, _aot.occupancy(r["registers"], r["shared"], spec.num_warps, 90)["ctas"]), r["label"]


def test_gluon_shws_specs_listed_for_sm90_and_complete():
    """The warp-specialised few-heads kernel: its 8- and 16-head configs are in the large class's
    AOT specs (every AOT variant of both fp8 formats with 16-bit q, with and without a block
    table; so the sm90-marked compile tests compile them), never in the small class's (sm_120;
    the 16-head config joined the space when it was picked for fp8_ds_mla, 2026-12-06). Both
    have sm_90 launch specs for both fp8 formats with
    their heads (8 / 16), two X slots, consumer 0's 4 warps and the partitions' register
    budgets, which add up to the SM's registers (16 warps: 4 x 184 + 4 x 184 + 8 x 72 = 16 x
    128)."""
    from kernels.sparse_mla import gluon_small_ws
    assert not [s for s in _sparse_mla.aot_specs("small")
                if s.kernel == "_sparse_mla_gluon_shws_kernel"]
    large = {s.label for s in _sparse_mla.aot_specs("large")
             if s.kernel == "_sparse_mla_gluon_shws_kernel"}
    want = {s.label for fmt, d_qk, q_dtype, final in _sparse_mla.AOT_VARIANTS
            if fmt in ("fp8_ds_mla", "fp8_model1") and q_dtype != torch.float32
            for cfg in (configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16)
            for s in _sparse_mla._gluon_specs(fmt, q_dtype, final, 2, "gluon_shws", cfg)}
    assert {f"gluon_shws h{h} w4 x2 {fmt} q=bfloat16 partial {bt}" for h in (8, 16)
            for fmt in ("fp8_ds_mla", "fp8_model1") for bt in ("block table", "slots")} <= want
    assert want == large
    for cfg in (configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16):
        for fmt in ("fp8_ds_mla", "fp8_model1"):
            specs = _sparse_mla._gluon_specs(fmt, torch.bfloat16, False, cfg.num_stages,
                                             "gluon_shws", cfg)
            assert [s.label for s in specs] == [
                f"gluon_shws h{cfg.block_h} w4 x2 {fmt} q=bfloat16 partial {bt}"
                for bt in ("block table", "slots")]
            for s in specs:
                assert s.num_warps == gluon_small_ws.NUM_WARPS == 4
                assert s.constexprs["HN"] == cfg.block_h and s.constexprs["NBUF"] == 2
                assert s.constexprs["PRODUCER_REGS"] == gluon_small_ws.PRODUCER_REGS
    w = gluon_small_ws
    assert (w.NUM_WARPS * w.CONSUMER_REGS + w.CONSUMER_WARPS.value * w.CONSUMER_REGS
            + 8 * w.PRODUCER_REGS) == 16 * 128


def _shws_compile(tmp_path, monkeypatch, variants, stage: int = 0) -> list:
    """The few-heads WS kernel's launch specs (both configs, both fp8 formats, each ``(q_dtype,
    final)`` of ``variants``, with and without a block table; ``STAGE`` as the module has it,
    asserted to be ``stage``) compiled for sm_90 with the GPU image's Triton. Asserts they fit
    the H200's shared memory and that each has two consumer loops holding the block's wgmmas
    (68; fp8_model1 with fp16 q 64) without spill traffic; returns the compile results."""
    specs = []
    for cfg in (configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16):
        for fmt in ("fp8_ds_mla", "fp8_model1"):
            for q_dtype, final in variants:
                specs.extend(_sparse_mla._gluon_specs(fmt, q_dtype, final, cfg.num_stages,
                                                      "gluon_shws", cfg))
    assert all(s.constexprs["STAGE"] == stage for s in specs)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    results = _aot.compile_specs(specs, (90,), sass=True, triton_path=_gpu_image_triton())
    _check_fit(results, 90, hardware.smem_limit(TARGETS[90]))
    for r in results:
        loops = r["sass"]["loops"]
        mma = [lp for lp in loops if lp["ops"].get("HGMMA")]
        model1_fp16 = "fp8_model1" in r["label"] and "float16" in r["label"] and "bfloat16" not in r["label"]
        assert len(mma) == 2, (r["label"], [lp["total"] for lp in loops])
        for lp in mma:
            assert lp["ops"]["HGMMA"] == (64 if model1_fp16 else 68), r["label"]
            assert not lp["ops"].get("LDL") and not lp["ops"].get("STL"), (r["label"], lp["ops"])
    return results


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_shws_compiles_without_spills_in_its_loops(tmp_path, monkeypatch):
    """The warp-specialised few-heads kernel for sm_90 with the GPU image's Triton, both sweep
    configs, both fp8 formats, bf16 and fp16 q, partial and final, with and without a block
    table: it fits the H200's shared memory, its two consumer loops hold the block's wgmmas (68;
    fp8_model1 with fp16 q 64) and no spill traffic, and the producer's loop none where it
    reads slots directly (the block-table builds of fp8_model1 at 16 heads reload 5 words: the
    AOT counts of 2026-12-05 in bench/NOTES.md)."""
    results = _shws_compile(tmp_path, monkeypatch, ((torch.bfloat16, False),
                                                    (torch.float16, False), (torch.bfloat16, True)))
    for r in results:
        loops = r["sass"]["loops"]
        if "slots" in r["label"]:
            prod = [lp for lp in loops if not lp["ops"].get("HGMMA")]
            assert prod and not any(lp["ops"].get("LDL") for lp in prod), r["label"]


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_shws_staged_producer_compiles(tmp_path, monkeypatch):
    """The few-heads WS kernel with the staged producer (``gluon_small_ws.RAW_STAGE`` 1) for
    sm_90 with the GPU image's Triton, both configs and fp8 formats, bf16 q, partial, with and
    without a block table: it fits the H200's shared memory with its raw slot (consumer 1's merge
    state moved into its X slot), the consumer loops keep their 68 wgmmas without spill traffic,
    and the producer loop copies one row block with ``cp.async`` as planned: 16-byte copies of
    the nope chunks and the rope (8 + 2 ds_mla, 7 + 2 model1) and one 4-byte copy a scale word
    (4 ds_mla, 2 model1), no more (a partition barrier between two copies into views of one
    buffer would show as more ``BAR`` than the loop's 5-6)."""
    from kernels.sparse_mla import gluon_small_ws
    monkeypatch.setattr(gluon_small_ws, "RAW_STAGE", 1)
    results = _shws_compile(tmp_path, monkeypatch, ((torch.bfloat16, False),), stage=1)
    for r in results:
        loops = r["sass"]["loops"]
        prod = [lp for lp in loops if lp["ops"].get("LDGSTS")]
        assert len(prod) == 1, (r["label"], [lp["ops"] for lp in loops])
        want = 14 if "fp8_ds_mla" in r["label"] else 11
        assert prod[0]["ops"]["LDGSTS"] == want and prod[0]["ops"].get("BAR", 0) <= 6, \
            (r["label"], prod[0]["ops"])


def test_indexer_gluon_specs_listed_for_sm90_only():
    """The Gluon logits kernels (sm_90 only) are in the large class's indexer AOT specs (so the
    sm90-marked compile test above compiles them): the one-partition kernel and the
    warp-specialised one at every (consumers, conversion) of the config space, N 1 and 2, with
    the fused histogram (lengths [B] and [B, N]) and without; never in the small class's."""
    from kernels.indexer.triton import IndexerLogitsConfig
    large = _indexer_aot.aot_specs("large")
    small = _indexer_aot.aot_specs("small")
    assert not [s for s in small if s.module.startswith("kernels.indexer.gluon")]
    labels = {s.label for s in large}
    space = IndexerLogitsConfig.SEARCH_SPACE
    for cons in space["ws_consumers"]:
        for conv in space["ws_convert"]:
            if cons == 4 and conv != "regs":            # four consumers: registers only
                assert not [lb for lb in labels if lb.startswith(f"logits gluon_ws c4 {conv}")]
                continue
            for n in (1, 2):
                for tail in ("hist=True cl_per_draft=False", "hist=True cl_per_draft=True",
                             "hist=False cl_per_draft=False"):
                    assert f"logits gluon_ws c{cons} {conv} N{n} {tail}" in labels
    assert {f"logits gluon N{n} hist=True cl_per_draft=False" for n in (1, 2)} <= labels


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_ws_logits_kernel_occupancy():
    """The warp-specialised logits kernel compiled for sm_90 with the GPU image's Triton: every
    spec fits the shared memory of the CTAs an SM is meant to hold (one consumer: two CTAs of
    <= 115,712 B; two to four: one of <= 232,448 B), the default conversion ("regs") at one, two
    or four consumers spills nothing at N 1, and the SASS has the partitions the design says: a
    producer loop of 6 TMA copies a step (2 pages x (2 key boxes + 1 scale box)) and one loop
    per consumer of 16 x N wgmma (64x64x16) a step (8 x N with four consumers: a page each),
    the N 1 ones without local memory."""
    from kernels.indexer import gluon_ws
    specs = [s for s in _indexer_aot.gluon_ws_specs() if s.constexprs["WRITE_HIST"]
             and not s.constexprs["CL_PER_DRAFT"]]
    results = _aot.compile_specs(specs, (90,), sass=True, triton_path=_gpu_image_triton())
    for spec, r in zip(specs, results):
        assert "error" not in r, f"{spec.label}: {r.get('error')}"
        cx = spec.constexprs
        cons, n = cx["CONSUMERS"], cx["N"]
        per_cta = (gluon_ws.SMEM_PER_SM // 2 - 1024) if cons == 1 else gluon_ws.SMEM_PER_BLOCK
        assert r["shared"] <= per_cta, (spec.label, r["shared"], per_cta)
        if cx["CONVERT"] == 0 and (cons <= 2 or cons == 4) and n == 1:
            assert r["spill_store_bytes"] in (0, None), (spec.label, r["spill_store_bytes"])
        loops = r["sass"]["loops"]
        producer = [lp for lp in loops if lp["ops"].get("UTMALDG") == 6]
        # a consumer's step: 128 token rows (16 wgmma a draft), a page with four consumers (8)
        per_step = 8 if cons == 4 else 16
        consumers = [lp for lp in loops if lp["ops"].get("HGMMA") == per_step * n]
        assert len(producer) == 1, (spec.label, [lp["ops"].get("UTMALDG") for lp in loops])
        assert len(consumers) == cons, (spec.label, [lp["ops"].get("HGMMA") for lp in loops])
        if n == 1 and (cons <= 2 or cons == 4):
            assert not any(lp["ops"].get(op) for lp in consumers for op in ("LDL", "STL")), spec.label


def test_vec_pass_b_stores_stay_scalar():
    """The split pass B's ``VEC`` layout (kernels/topk/triton.py ``_pass_b``): its slot tensors
    carry a contiguity hint that is not true of them, which is safe only while every store is
    predicated per key and so emitted one key at a time. Compiled for sm_90 and sm_120 with the
    GPU image's Triton: the block loop stores with scalar ``STG.E`` only, loads with
    ``LDG.E.128``, and converts no layout through shared memory beyond the scan's (the default
    launch's 5 barriers a block)."""
    from kernels.topk.triton_aot import aot_specs
    specs = [s for s in aot_specs("large") if s.kernel == "_topk_scatter_kernel"
             and s.constexprs.get("VEC") and "plan SP8" in s.label]
    assert specs
    results = _aot.compile_specs(specs, (90, 120), sass=True, triton_path=_gpu_image_triton())
    for r in results:
        assert "error" not in r, r.get("error")
        loop = max(r["sass"]["loops"], key=lambda lp: lp["total"])
        mem = loop["memory_sync"]
        stores = {k: v for k, v in mem.items() if k.startswith("STG")}
        assert set(stores) == {"STG.E"}, (r["label"], r["cc"], stores)
        assert any(k.startswith("LDG.E.128") for k in mem), (r["label"], r["cc"], mem)
        assert sum(v for k, v in mem.items() if k.startswith("BAR")) <= 5, (r["label"], mem)


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_ws_latent_compiles_without_spills(tmp_path, monkeypatch):
    """The latent warp-specialised kernel for sm_90 with the GPU image's Triton (the compiler
    the H200 runs), both full-slot protocols (``SIGNAL`` 0 / 1) and both P exchanges
    (``P_SMEM`` 1 / 0), bf16 and fp16, partial and final: it fits the H200's shared memory,
    nothing spills at the producer's register budget (``LATENT_PRODUCER_REGS``; the consumer
    gets the rest), the producer issues 36 16-byte cp.async (``LDGSTS``) a thread a block (9
    chunks x 4 rows) and nothing else copies, and the consumer's block loop (the largest loop)
    holds its 36 score wgmmas plus 32 value wgmmas per p part (bf16: p and its residual, 100;
    fp16: 68) and 8 barriers with P through shared memory. Counts of 2026-12-05 in
    bench/NOTES.md."""
    import dataclasses
    specs = []
    for q_dtype, final in ((torch.bfloat16, False), (torch.float16, False), (torch.bfloat16, True)):
        for spec in _sparse_mla._gluon_specs("latent", q_dtype, final, 2, "gluon_ws"):
            for signal, p_smem in ((0, 1), (1, 1), (0, 0), (1, 0)):
                specs.append(dataclasses.replace(
                    spec, label=f"{spec.label} signal {signal} p_smem {p_smem}",
                    constexprs={**spec.constexprs, "SIGNAL": signal, "P_SMEM": p_smem}))
    path = _gpu_image_triton()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))   # a cached compile skips ptxas -v
    results = _aot.compile_specs(specs, (90,), sass=True, triton_path=path)
    _check_fit(results, 90, hardware.smem_limit(TARGETS[90]))
    for spec, r in zip(specs, results):
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
        assert r["sass"]["ops"].get("LDGSTS") == 36, (r["label"], r["sass"]["ops"].get("LDGSTS"))
        producer, consumer = r["sass"]["loops"]            # the partitions' block loops
        assert producer["memory_sync"].get("LDGSTS.E.BYPASS.128") == 36, (r["label"], producer)
        want = 100 if "bfloat16" in r["label"] else 68
        assert consumer["ops"].get("HGMMA") == want, (r["label"], consumer)
        if r["label"].endswith("p_smem 1"):
            assert consumer["ops"].get("BAR") == 8, (r["label"], consumer)


def _xo_ptx(inits) -> str:
    """PTX text in the shape Triton 3.6 emits for ``(offset, count)`` mbarrier inits: a
    ``global_smem`` base, an add chain onto it, one operand as reg + imm."""
    lines = ["mov.b32 %r1, global_smem;", f"add.s32 %r2, %r1, {inits[0][0]};"]
    ops = ["[%r2]"]
    for i, (off, _) in enumerate(inits[1:], start=3):
        lines.append(f"add.s32 %r{i}, %r2, {off - inits[0][0]};")
        ops.append(f"[%r{i}]")
    ops[4] = f"[%r2+{inits[4][0] - inits[0][0]}]"
    return "\n".join(lines + [f"@%p1 mbarrier.init.shared::cta.b64 {o}, {c};"
                              for o, (_, c) in zip(ops, inits)])


def test_gluon_xo_offset_reader_on_ptx_text():
    """``gluon_cluster.mbarrier_inits`` / ``gluon_xo.kernel_offsets`` on PTX in the shape Triton
    3.6 emits; anything else (an operand not ``global_smem`` + immediates, another count, a
    spacing or arrival count not the crossover kernel's, barriers among the chunks) is refused
    (``ValueError``) rather than guessed."""
    from kernels.sparse_mla import gluon_cluster, gluon_xo
    inits = [(65536 + 16384 * c, 1) for c in range(9)] + [(226336, 1), (226352, 2), (226344, 1),
                                                          (226360, 2)]
    ptx = _xo_ptx(inits)
    assert gluon_cluster.mbarrier_inits(ptx) == inits
    assert gluon_xo.kernel_offsets(ptx, "fp8_ds_mla", 2) == (65536, 16384, 226336, 226352)
    with pytest.raises(ValueError, match="expected 12"):          # model1: 7 chunks + rope
        gluon_xo.kernel_offsets(ptx, "fp8_model1", 2)
    bad = ptx.replace(f"add.s32 %r5, %r2, {inits[3][0] - 65536};", "mul.lo.s32 %r5, %r2, 3;")
    with pytest.raises(ValueError, match="not global_smem"):
        gluon_cluster.mbarrier_inits(bad)
    with pytest.raises(ValueError, match="no `mov.b32"):
        gluon_cluster.mbarrier_inits(ptx.replace("global_smem", "other_smem"))
    for broken, why in (([(o + 16 * (i == 2), c) for i, (o, c) in enumerate(inits)], "equally"),
                        (inits[:10] + [(226352, 1)] + inits[11:], "counts"),
                        (inits[:9] + [(70000, 1)] + inits[10:], "8 bytes apart|inside")):
        with pytest.raises(ValueError, match=why):
            gluon_xo.kernel_offsets(_xo_ptx(broken), "fp8_ds_mla", 2)


def test_gluon_xs_offset_reader_on_ptx_text():
    """``gluon_xs.kernel_offsets``: the crossover kernel's reader with ``empty`` counting 4
    arrivals and three handover barriers after the slots' (the inits of the AOT compile,
    Triton 3.6.0); the crossover kernel's own inits, or a handover barrier among the chunks,
    are refused."""
    from kernels.sparse_mla import gluon_xs
    inits = [(65536 + 16384 * c, 1) for c in range(9)] + [
        (223744, 1), (223760, 4), (223752, 1), (223768, 4), (223792, 1), (223800, 1), (223824, 1)]
    assert gluon_xs.kernel_offsets(_xo_ptx(inits), "fp8_ds_mla", 2) == (65536, 16384, 223744,
                                                                         223760)
    xo_inits = inits[:9] + [(223744, 1), (223760, 2), (223752, 1), (223768, 2)]
    with pytest.raises(ValueError, match="expected 16"):
        gluon_xs.kernel_offsets(_xo_ptx(xo_inits), "fp8_ds_mla", 2)
    with pytest.raises(ValueError, match="inside"):
        gluon_xs.kernel_offsets(_xo_ptx(inits[:15] + [(70000, 1)]), "fp8_ds_mla", 2)


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_xs_consumers_keep_descriptors_out_of_local_memory(tmp_path, monkeypatch):
    """The seesaw kernel for sm_90 with the GPU image's Triton, fp8_ds_mla, bf16 q, partial with
    a block table and final with plain slots: it fits the H200's shared memory, its offsets
    read off its PTX (``gluon_xs.kernel_offsets``), its producer converts half a block a warp
    (``gluon_xo``'s), and each consumer warpgroup's loop (one own block and one of the other's:
    32 nope score, 4 rope and 2 x 16 value wgmma instructions, 68) stores nothing to local
    memory and reloads no 64-bit value: its wgmma descriptors stay out of local memory
    (hoisted, the loop-invariant descriptors that ``gluon_xs._opaque`` prevents took 64-73
    64-bit local loads a loop, 2026-12-06) and the rope dot shares the scores' accumulator (two
    accumulators spilled 32 stores a loop). At the consumers' 192 registers (the producer's 64,
    ``gluon_xs.PRODUCER_REGS``) warpgroup 1's loop reloads three loop-invariant 32-bit words
    once a loop, so at most 3 local loads. Loops of 1,090 / 1,147 SASS a warp (AOT, Triton
    3.6.0, 2026-12-06)."""
    from kernels.sparse_mla import gluon_xs
    specs = [_sparse_mla._gluon_specs("fp8_ds_mla", torch.bfloat16, False, 2, "gluon_xs")[0],
             _sparse_mla._gluon_specs("fp8_ds_mla", torch.bfloat16, True, 2, "gluon_xs")[1]]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    results = _aot.compile_specs(specs, (90,), sass=True, triton_path=_gpu_image_triton())
    _check_fit(results, 90, hardware.smem_limit(TARGETS[90]))
    for r in results:
        x_off, step, full, empty = gluon_xs.offsets_of_xs_inits(r["mbarrier_inits"], "fp8_ds_mla",
                                                                2)
        assert x_off + 9 * step <= min(full, empty) and max(full, empty) + 16 <= r["shared"]
        loops = r["sass"]["loops"]
        mma = [lp for lp in loops if lp["ops"].get("HGMMA")]
        prod = [lp for lp in loops if not lp["ops"].get("HGMMA")]
        assert [lp["ops"]["HGMMA"] for lp in mma] == [68, 68], (r["label"], [lp["total"] for lp in loops])
        assert prod and prod[0]["memory_sync"].get("F2FP.F16.E4M3.UNPACK_B") == 32, r["label"]
        for lp in mma:
            ms = lp["memory_sync"]
            assert not any(k.startswith("STL") or (k.startswith("LDL") and k.endswith(".64"))
                           for k in ms), (r["label"], ms)
            assert sum(v for k, v in ms.items() if k.startswith("LDL")) <= 3, (r["label"], ms)


@pytest.mark.slow
@pytest.mark.sm90
def test_gluon_xo_compiles_and_its_offsets_read(tmp_path, monkeypatch):
    """The crossover kernel for sm_90 with the GPU image's Triton, both fp8 formats, bf16 q,
    partial with a block table and final with plain slots: it fits the H200's shared memory, its
    launcher can read the chunk buffers' and barriers' offsets off its PTX
    (``gluon_xo.kernel_offsets``: x_off, step, full, empty inside the kernel's shared memory),
    its producer converts half a block a warp (32 e4m3 conversions, against the
    warp-specialised kernel's 64) and copies 9 (8) halves to the peer, and its consumer keeps
    the warp-specialised kernel's 68 wgmmas with no 64-bit spill reloads (the descriptors stay
    in the loop: bench/NOTES.md, crossover). Counts of 2026-12-06 (AOT, Triton 3.6.0)."""
    from kernels.sparse_mla import gluon_xo
    specs = []
    for fmt in ("fp8_ds_mla", "fp8_model1"):
        specs.append(_sparse_mla._gluon_specs(fmt, torch.bfloat16, False, 2, "gluon_xo")[0])
        specs.append(_sparse_mla._gluon_specs(fmt, torch.bfloat16, True, 2, "gluon_xo")[1])
    path = _gpu_image_triton()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    results = _aot.compile_specs(specs, (90,), sass=True, triton_path=path)
    _check_fit(results, 90, hardware.smem_limit(TARGETS[90]))
    for spec, r in zip(specs, results):
        fmt = "fp8_model1" if "fp8_model1" in r["label"] else "fp8_ds_mla"
        nc = 7 if fmt == "fp8_model1" else 8
        inits = r["mbarrier_inits"]
        assert isinstance(inits, list), (r["label"], inits)
        x_off, step, full, empty = gluon_xo.offsets_of_inits(inits, fmt, 2)
        assert x_off + (nc + 1) * step <= min(full, empty) and max(full, empty) + 16 <= r["shared"]
        producer, consumer = r["sass"]["loops"][0], r["sass"]["loops"][-1]
        assert producer["memory_sync"].get("F2FP.F16.E4M3.UNPACK_B") == 4 * nc, r["label"]
        assert consumer["ops"].get("HGMMA") == 68 and not consumer["memory_sync"].get("LDL.64"), \
            (r["label"], consumer["ops"].get("HGMMA"), consumer["memory_sync"])
