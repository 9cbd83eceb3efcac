"""scripts/apply_picks.py: the picks a sweep supports, by the rules of its docstring; no evidence
leaves a switch alone; unreadable input is refused before anything is written (always run with
--dry-run here, and the tree's files are checked unchanged)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = ("kernels/sparse_mla/configs.py", "kernels/indexer/gluon_ws.py",
         "kernels/dispatch/sm_90.json")


def _script():
    spec = importlib.util.spec_from_file_location("apply_picks",
                                                  ROOT / "scripts" / "apply_picks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _digests():
    return {f: hashlib.md5((ROOT / f).read_bytes()).hexdigest() for f in FILES}


def _mla_rows(sh_us, base_us=100.0, status="ok"):
    return {"rows": [
        {"shape_key": "v32_h16", "variant": "baseline", "kv_format": "fp8_ds_mla", "H": 16,
         "status": "ok", "median_us": base_us},
        {"shape_key": "v32_h16", "variant": "gluon_sh_h16w4", "kv_format": "fp8_ds_mla", "H": 16,
         "status": status, "median_us": sh_us},
        {"shape_key": "v4_h64", "variant": "baseline", "kv_format": "fp8_model1", "H": 64,
         "status": "ok", "median_us": 50.0}]}


def _idx_rows(ws_us, exact=True):
    row = dict(shape="v32_b64_l64k", error=None, repeatable=True, same_topk_set=True)
    return {"rows": [dict(row, variant="gluon", logits_us=300.0, bitwise_logits_vs_first=True),
                     dict(row, variant="gluon_ws", logits_us=ws_us, bitwise_logits_vs_first=exact)]}


def _run(tmp_path, capsys, **files):
    args = ["--dry-run"]
    for kind, data in files.items():
        f = tmp_path / f"{kind}.json"
        f.write_text(data if isinstance(data, str) else json.dumps(data))
        args += [f"--{kind}", str(f)]
    rc = _script().main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_picks_follow_the_rules(tmp_path, capsys):
    before = _digests()
    rc, out, _ = _run(tmp_path, capsys, mla=_mla_rows(60.0), idx=_idx_rows(200.0))
    assert rc == 0 and "GLUON_SH_PICKED = ('fp8_ds_mla',)" in out
    assert "gluon_ws.PICKED = True" in out
    assert "v4_h64" in out and "not counted" in out             # H 64: outside the range
    rc, out, _ = _run(tmp_path, capsys, mla=_mla_rows(98.0), idx=_idx_rows(200.0, exact=False))
    assert "GLUON_SH_PICKED = ()" in out and "gluon_ws.PICKED = False" in out   # < 3 %; not exact
    rc, out, _ = _run(tmp_path, capsys, mla=_mla_rows(None, status="FAILED check"),
                      idx=_idx_rows(310.0))
    assert "GLUON_SH_PICKED = ()" in out and "gluon_ws.PICKED = False" in out   # failed; slower
    assert _digests() == before


def _h8_rows(ws_us, base_kernel="gluon_sh", sh_us=28.7, base_us=28.7, ws_status="ok"):
    row = dict(shape_key="v4_h8", kv_format="fp8_model1", H=8, status="ok")
    return {"rows": [
        dict(row, variant="baseline", median_us=base_us, config={"kernel": base_kernel}),
        dict(row, variant="gluon_sh_h8w4", median_us=sh_us),
        dict(row, variant="gluon_shws_h8", median_us=ws_us, status=ws_status)]}


def test_few_heads_picks_once_in_effect(tmp_path, capsys):
    """Where the baseline already runs a few-heads kernel the format stays picked when the
    variant passed (not un-picked for tying with itself); the warp-specialised kernel joins for a
    format when 3 % below both the baseline and the one-partition variant, and stays once the
    baseline runs it; a failed check drops it; the table rewrite names the config it picks."""
    before = _digests()
    rc, out, _ = _run(tmp_path, capsys, mla=_h8_rows(22.3))
    assert rc == 0 and "GLUON_SH_PICKED = ('fp8_model1',)" in out
    assert "GLUON_SHWS_PICKED = ('fp8_model1',)" in out
    rc, out, _ = _run(tmp_path, capsys, mla=_h8_rows(28.0))                   # < 3 % better
    assert "GLUON_SH_PICKED = ('fp8_model1',)" in out and "GLUON_SHWS_PICKED = ()" in out
    rc, out, _ = _run(tmp_path, capsys, mla=_h8_rows(22.3, base_kernel="gluon_shws",
                                                     base_us=22.3))            # in effect
    assert "GLUON_SHWS_PICKED = ('fp8_model1',)" in out
    rc, out, _ = _run(tmp_path, capsys, mla=_h8_rows(None, ws_status="FAILED check"))
    assert "GLUON_SHWS_PICKED = ()" in out
    rc, out, _ = _run(tmp_path, capsys, mla=_h8_rows(40.0, base_kernel="triton", base_us=42.7))
    # below the Triton baseline but not below the one-partition kernel: that one is picked
    assert "GLUON_SH_PICKED = ('fp8_model1',)" in out and "GLUON_SHWS_PICKED = ()" in out
    assert _digests() == before
    mod = _script()
    table = tmp_path / "sm_90.json"
    table.write_text(json.dumps({"entries": [
        {"op": "sparse_mla_decode", "backend": "torch", "path": "triton",
         "bucket": {"B": 64, "H": 8, "K": 640, "N": 1, "d_qk": 512, "kv_format": "fp8_model1"},
         "config": {"kernel": "triton"}},
        {"op": "sparse_mla_decode", "backend": "torch", "path": "triton",
         "bucket": {"B": 64, "H": 8, "K": 2048, "N": 1, "d_qk": 576, "kv_format": "fp8_ds_mla"},
         "config": {"kernel": "triton"}}]}))
    text, done = mod.edit_table(table, {"fp8_model1", "fp8_ds_mla"}, None, [], {"fp8_model1"})
    got = [e["config"] for e in json.loads(text)["entries"]]
    from kernels.sparse_mla import configs
    assert got == [configs.SPARSE_MLA_GLUON_SHWS8.to_dict(), configs.SPARSE_MLA_GLUON_SH8.to_dict()]
    assert len(done) == 2


@pytest.mark.parametrize("mla,idx,word", [
    ({"rows": []}, {"rows": []}, "unchanged (no evidence)"),
])
def test_no_evidence_leaves_the_switches(tmp_path, capsys, mla, idx, word):
    rc, out, _ = _run(tmp_path, capsys, mla=mla, idx=idx)
    assert rc == 0 and out.count(word) == 3          # GLUON_SH_PICKED, GLUON_SHWS_PICKED, PICKED


@pytest.mark.parametrize("files,word", [
    (dict(mla="not json"), "cannot read a JSON sweep file"),
    (dict(mla=[1, 2]), "a 'rows' list"),
    (dict(idx={"rows": None}), "a 'rows' list"),
    (dict(idx={"rows": [{"variant": "gluon"}]}), "lacks a field"),
    (dict(mla=_mla_rows(60.0), dispatch={"arch": "sm_90"}), "cannot read a dispatch table"),
])
def test_bad_input_writes_nothing(tmp_path, capsys, files, word):
    before = _digests()
    rc, _, err = _run(tmp_path, capsys, **files)
    assert rc == 2 and word in err and "nothing written" in err
    assert _digests() == before
    assert _script().main(["--dry-run", "--mla", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
