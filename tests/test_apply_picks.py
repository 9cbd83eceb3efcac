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
    # fp8_model1 has no row of the few-heads range here: it keeps its state (picked)
    rc, out, _ = _run(tmp_path, capsys, mla=_mla_rows(60.0), idx=_idx_rows(200.0))
    assert rc == 0 and "GLUON_SH_PICKED = ('fp8_ds_mla', 'fp8_model1')" in out
    assert "gluon_ws.PICKED = True" in out
    assert "v4_h64" in out and "not counted" in out             # H 64: outside the range
    rc, out, _ = _run(tmp_path, capsys, mla=_mla_rows(98.0), idx=_idx_rows(200.0, exact=False))
    assert "GLUON_SH_PICKED = ('fp8_model1',)" in out and "gluon_ws.PICKED = False" in out
    rc, out, _ = _run(tmp_path, capsys, mla=_mla_rows(None, status="FAILED check"),
                      idx=_idx_rows(310.0))                      # < 3 %, not exact; failed, slower
    assert "GLUON_SH_PICKED = ('fp8_model1',)" in out and "gluon_ws.PICKED = False" in out
    assert _digests() == before


def _h8_rows(ws_us, base_kernel="gluon_sh", sh_us=28.7, base_us=28.7, ws_status="ok",
             sh_status="ok"):
    row = dict(shape_key="v4_h8", kv_format="fp8_model1", H=8, status="ok")
    return {"rows": [
        dict(row, variant="baseline", median_us=base_us, config={"kernel": base_kernel}),
        dict(row, variant="gluon_sh_h8w4", median_us=sh_us, status=sh_status),
        dict(row, variant="gluon_shws_h8", median_us=ws_us, status=ws_status)]}


def test_few_heads_picks_once_in_effect(tmp_path, capsys):
    """Where the baseline already runs a few-heads kernel the format stays picked when the
    variant passed (not un-picked for tying with itself); the warp-specialised kernel joins for a
    format when 3 % below both the baseline and the one-partition variant, stays once the
    baseline runs it unless 3 % slower than the one-partition variant, leaves on a failed check,
    and only a format the few-heads kernel is picked for holds it; a format with no row keeps
    its state (fp8_ds_mla below)."""
    before = _digests()
    both, m1 = "('fp8_ds_mla', 'fp8_model1')", "('fp8_model1',)"
    cases = [  # (rows, GLUON_SH_PICKED, GLUON_SHWS_PICKED)
        (_h8_rows(22.3), both, m1),                                           # joins
        (_h8_rows(28.0), both, "()"),                                         # < 3 % better
        (_h8_rows(22.3, base_kernel="gluon_shws", base_us=22.3), both, m1),   # in effect
        (_h8_rows(29.0, base_kernel="gluon_shws", base_us=29.0, sh_us=28.0), both, "()"),  # > 3 %
        (_h8_rows(None, ws_status="FAILED check"), both, "()"),               # failed
        # below the Triton baseline but not below the one-partition kernel: that one is picked
        (_h8_rows(40.0, base_kernel="triton", base_us=42.7), both, "()"),
        # the one-partition variant failed: the format leaves both switches
        (_h8_rows(22.3, base_kernel="gluon_shws", base_us=22.3, sh_status="FAILED check"),
         "('fp8_ds_mla',)", "()"),
    ]
    for rows, sh, ws in cases:
        rc, out, _ = _run(tmp_path, capsys, mla=rows)
        assert rc == 0 and f"GLUON_SH_PICKED = {sh}" in out and f"GLUON_SHWS_PICKED = {ws}" in out, \
            (rows, out)
    assert _digests() == before


def test_both_mla_switches_written_to_one_file(tmp_path, capsys, monkeypatch):
    """The two decisions edit one file (configs.py): the second edit starts from the first's
    text, so both lines change (run without --dry-run on a copy of the tree's file)."""
    mod = _script()
    (tmp_path / "kernels" / "sparse_mla").mkdir(parents=True)
    cfg = tmp_path / "kernels" / "sparse_mla" / "configs.py"
    cfg.write_text((ROOT / "kernels/sparse_mla/configs.py").read_text())
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    f = tmp_path / "mla.json"
    f.write_text(json.dumps(_h8_rows(28.0, sh_status="FAILED check")))
    assert mod.main(["--mla", str(f)]) == 0
    text = cfg.read_text()
    assert "\nGLUON_SH_PICKED: tuple = ('fp8_ds_mla',)\n" in text
    assert "\nGLUON_SHWS_PICKED: tuple = ()\n" in text
    capsys.readouterr()


def test_table_rewrite_follows_the_switches(tmp_path):
    """The table's few-heads entries take ``few_heads_config`` for the picked formats (the
    warp-specialised 8-head config where that is picked, its 16-head config at 9..16 heads for
    ``configs.GLUON_SHWS16_PICKED``, which this script leaves as set), and an entry of a format
    no longer picked goes back to the heuristic's choice without the few-heads kernels."""
    mod = _script()
    from kernels.sparse_mla import configs
    ent = lambda H, K, d_qk, fmt, kernel: {  # noqa: E731
        "op": "sparse_mla_decode", "backend": "torch", "path": "triton",
        "bucket": {"B": 64, "H": H, "K": K, "N": 1, "d_qk": d_qk, "kv_format": fmt},
        "config": {"kernel": kernel}}
    table = tmp_path / "sm_90.json"
    table.write_text(json.dumps({"entries": [ent(8, 640, 512, "fp8_model1", "triton"),
                                             ent(8, 2048, 576, "fp8_ds_mla", "triton"),
                                             ent(16, 2048, 576, "fp8_ds_mla", "gluon_sh")]}))
    text, done = mod.edit_table(table, {"fp8_model1", "fp8_ds_mla"}, None, [], {"fp8_model1"})
    got = [e["config"] for e in json.loads(text)["entries"]]
    assert "fp8_ds_mla" in configs.GLUON_SHWS16_PICKED
    assert got == [configs.SPARSE_MLA_GLUON_SHWS8.to_dict(), configs.SPARSE_MLA_GLUON_SH8.to_dict(),
                   configs.SPARSE_MLA_GLUON_SHWS16.to_dict()] and len(done) == 3
    text, done = mod.edit_table(table, {"fp8_model1"}, None, [], set())
    got = [e["config"] for e in json.loads(text)["entries"]]
    assert got[0] == configs.SPARSE_MLA_GLUON_SH8.to_dict()
    assert got[2] == configs.sparse_mla_heuristic(16, configs.LARGE_SMEM, rows=64, topk=2048,
                                                  gluon=True, gluon_ws=True).to_dict()
    assert got[2].get("kernel", "triton") == "triton" and len(done) == 2   # default: omitted


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
    # a baseline config that is not an object; a head count that is not a positive integer
    (dict(mla={"rows": [dict(_h8_rows(22.3)["rows"][0], config="triton")]}), "bad value"),
    (dict(mla={"rows": [dict(r, H=0) for r in _h8_rows(22.3)["rows"]]}),
     "H must be a positive integer, got 0"),
    # a table entry whose config is a list / whose heads are negative
    (dict(mla=_h8_rows(22.3), dispatch={"entries": [
        {"op": "sparse_mla_decode", "backend": "torch", "path": "triton",
         "bucket": {"B": 64, "H": 8, "K": 640, "N": 1, "kv_format": "fp8_model1"},
         "config": [1]}]}), "config is not an object"),
    (dict(mla=_h8_rows(22.3), dispatch={"entries": [
        {"op": "sparse_mla_decode", "backend": "torch", "path": "triton",
         "bucket": {"B": 64, "H": -3, "K": 640, "N": 1, "kv_format": "fp8_model1"},
         "config": {"kernel": "triton"}}]}), "H must be a positive integer, got -3"),
    (dict(idx="[" * 100_000 + "]" * 100_000), "cannot read a JSON sweep file"),
])
def test_bad_input_writes_nothing(tmp_path, capsys, files, word):
    before = _digests()
    rc, _, err = _run(tmp_path, capsys, **files)
    assert rc == 2 and word in err and "nothing written" in err
    assert _digests() == before
    assert _script().main(["--dry-run", "--mla", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
