"""scripts/profile_kernels.py's timeline reader (``--timeline``): the GPU kernels of a Chrome trace
in start order, and how long two or more of them ran at once (the torch layer's side-stream
overlap, bench/NOTES.md). On a synthetic trace: no GPU needed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("profile_kernels", ROOT / "scripts" / "profile_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _k(name, stream, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": stream,
            "args": {"stream": stream}}


def test_timeline_and_concurrency():
    m = _mod()
    trace = {"traceEvents": [
        _k("gemm_wq_b", 7, 1000.0, 20.0),           # main stream 1000..1020
        _k("logits", 13, 1005.0, 6.0),              # side 1005..1011: 6 us beside the GEMM
        _k("scatter", 13, 1012.0, 10.0),            # side 1012..1022: 8 us beside it
        _k("prep_q", 7, 1030.0, 2.0),               # alone, after a 8 us gap
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 990.0, "dur": 50.0},   # not a kernel
        {"ph": "X", "cat": "gpu_user_annotation", "name": "dsa::indexer_topk", "ts": 1005.0, "dur": 17.0},
    ]}
    tl = m.kernel_timeline(trace)
    assert [k["name"] for k in tl] == ["gemm_wq_b", "logits", "scatter", "prep_q"]
    assert tl[0] == {"name": "gemm_wq_b", "stream": 7, "start_us": 0.0, "dur_us": 20.0}
    assert tl[2]["start_us"] == 12.0 and tl[2]["stream"] == 13
    c = m.concurrent_us(tl)
    assert c == {"span_us": 32.0, "busy_us": 24.0, "concurrent_us": 14.0, "streams": ["13", "7"]}
    assert m.kernel_timeline({"traceEvents": []}) == [] and m.kernel_timeline(trace["traceEvents"]) == tl
    assert m.concurrent_us([]) == {"span_us": 0.0, "busy_us": 0.0, "concurrent_us": 0.0, "streams": []}


def test_usage_errors_exit_2_before_any_work(capsys):
    """Bad ``--op`` / ``--reps``, ``--timeline`` with ``--plain``, or no matching row: exit 2 with
    the reason (argparse); without a CUDA GPU a run (not ``--list``) exits 2 saying so."""
    import pytest
    import torch

    m = _mod()
    for argv, msg in [(["--list", "--op", "bogus"], "--op: expected one of"),
                      (["--list", "-k", "nomatch"], "no target row matches"),
                      (["--reps", "0"], "--reps: expected a positive int, got 0"),
                      (["--timeline", "--plain"], "--timeline needs the profiler")]:
        with pytest.raises(SystemExit) as e:
            m.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert m.main(["--list", "--op", "dsa_decode_layer"]) == 0
    assert "dsa_decode_layer DSV4_FLASH B=1" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert m.main(["--op", "dsa_decode_layer", "-k", "B=1 "]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
