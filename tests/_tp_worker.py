"""Inputs of the composed decode-step / tensor-parallel tests, and the torch.distributed worker.

``make_step_case`` composes ``kernels.cases.make_indexer_case`` (indexer cache, block table,
context lengths; stale pages past each request) with a latent cache over the same page pool and
an MLA query, and NaN-fills every latent slot that lies past a request's length (stale pages and
page tails), so a step that attended anything outside the valid range produces NaN.

``run_workers`` starts ``world`` CPU processes (torch.multiprocessing, forkserver) on a gloo group;
each runs ``torch_impl.tp.dsa_decode_step_tp`` in both indexer modes on the same case and writes
its head shard and indices to ``<outdir>/rank<r>.npz`` for the parent (pytest) to check. The
children inherit ``TRITON_INTERPRET=1`` from the parent's environment (tests/conftest.py).
``run_uneven_gather`` starts ``world`` processes that split heads by hand unevenly and call
``gather_heads`` (no kernels): each rank records the error it got.

On GPUs use torchrun instead (bench/tp_bench.py); this file is for the CPU tests.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import numpy as np

from kernels import cases, formats, reference


@dataclass
class StepCase:
    """One decode step: ``dsa_decode_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table,
    context_lens, sm_scale, topk, kv_format=..., d_v=..., attn_sink=...)``, NumPy arrays."""

    name: str
    q: np.ndarray              # [B, N, H, D_qk] float16 / float32 (bf16 on GPUs)
    kv_cache: np.ndarray       # kv_format layout over the indexer case's page pool
    idx_q: np.ndarray          # [B, N, H_I, D_I] float8_e4m3fn
    idx_weights: np.ndarray    # [B, N, H_I] float32
    k_cache: np.ndarray        # fp8_indexer uint8 [num_pages, P * (D_I + 4)]
    block_table: np.ndarray    # [B, max_pages] int32
    context_lens: np.ndarray   # [B] int32
    sm_scale: float
    topk: int
    kv_format: str
    d_v: int = 512
    attn_sink: np.ndarray | None = None     # [H] float32
    params: dict = field(default_factory=dict)

    def args(self) -> tuple:
        return (self.q, self.kv_cache, self.idx_q, self.idx_weights, self.k_cache,
                self.block_table, self.context_lens, self.sm_scale, self.topk)

    def kwargs(self) -> dict:
        return dict(kv_format=self.kv_format, d_v=self.d_v, attn_sink=self.attn_sink)

    def reference_logits(self) -> np.ndarray:
        """float64 ``[B, N, max_pages * P]`` indexer logits."""
        return reference.indexer_logits(self.idx_q, self.idx_weights, self.k_cache,
                                        self.block_table, self.context_lens)

    def reference_mla(self, indices: np.ndarray):
        """float64 (out ``[B, N, H, d_v]``, lse ``[B, N, H]``) of sparse MLA over ``indices``
        (logical positions through the block table): the reference fed the step's own top-k."""
        return reference.sparse_mla_decode(self.q, self.kv_cache, np.asarray(indices), self.sm_scale,
                                           kv_format=self.kv_format, d_v=self.d_v,
                                           block_table=self.block_table, attn_sink=self.attn_sink)


def make_step_case(seed: int = 0, *, B: int = 2, N: int = 1, H: int = 16, d_qk: int = 576,
                   kv_format: str = "fp8_ds_mla", q_dtype: str = "float16", topk: int = 64,
                   P: int = 64, H_I: int = 16, D_I: int = 128, lens=None, max_len: int = 320,
                   attn_sink: bool = False, name: str | None = None, **indexer_kw) -> StepCase:
    """A random decode-step case (small shapes for the interpreter; real D_qk / D_I / formats).

    ``indexer_kw`` go to ``kernels.cases.make_indexer_case`` (``ties``, ``nan_rows``,
    ``neg_pages``, ``table_len``, ``structured`` ...). ``kv_format`` "latent" stores the latent
    in ``q_dtype``.
    """
    rng = np.random.default_rng(seed)
    ic = cases.make_indexer_case(rng, B=B, N=N, H_I=H_I, D_I=D_I, P=P, lens=lens, max_len=max_len,
                                 topk=topk, **indexer_kw)
    num_pages = ic.k_cache.shape[0]
    latent = rng.standard_normal((num_pages, P, d_qk)).astype(np.float32)
    kv = formats.quantize_kv(latent, kv_format, cases.Q_DTYPES[q_dtype])
    # NaN-fill every slot that is not a valid position of some request.
    lens_b = np.asarray(ic.context_lens, np.int64).reshape(B, -1).max(axis=1)
    valid = np.zeros(num_pages * P, bool)
    for b in range(B):
        j = np.arange(int(lens_b[b]))
        page = ic.block_table[b, j // P].astype(np.int64)
        ok = page >= 0
        valid[page[ok] * P + (j % P)[ok]] = True
    cases._nan_bytes(kv_format, kv, np.flatnonzero(~valid), P)
    q = cases._cast((0.5 * rng.standard_normal((B, N, H, d_qk))).astype(np.float32), q_dtype)
    sink = rng.standard_normal(H).astype(np.float32) if attn_sink else None
    name = name or (f"step_B{B}_N{N}_H{H}_D{d_qk}_K{topk}_P{P}_L{int(lens_b.max(initial=0))}_"
                    f"{kv_format}_{q_dtype}")
    return StepCase(name=name, q=q, kv_cache=kv, idx_q=ic.q, idx_weights=ic.weights,
                    k_cache=ic.k_cache, block_table=ic.block_table, context_lens=ic.context_lens,
                    sm_scale=d_qk ** -0.5, topk=topk, kv_format=kv_format, attn_sink=sink,
                    params=dict(ic.params, H=H, d_qk=d_qk, q_dtype=q_dtype))


# ============================================================================ torch workers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, outdir: str, jobs: list) -> None:
    import torch  # noqa: F401  (imported before torch.distributed in the child)
    import torch.distributed as dist

    from _interp_fast import speed_up_triton_interpreter
    speed_up_triton_interpreter()       # as in the pytest process (tests/conftest.py)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        from torch_impl import tp
        from torch_impl._common import as_tensor

        for j, (case_kw, path) in enumerate(jobs):
            c = make_step_case(**case_kw)
            t = [as_tensor(a) for a in (c.q, c.kv_cache, c.idx_q, c.idx_weights, c.k_cache,
                                        c.block_table, c.context_lens)]
            q_local = tp.shard_heads(t[0], rank, world)
            sink = None if c.attn_sink is None else tp.shard_heads(as_tensor(c.attn_sink), rank,
                                                                   world, dim=0)
            res = {}
            for mode in tp.INDEXER_MODES:
                out, lse, idx = tp.dsa_decode_step_tp(q_local, *t[1:], c.sm_scale, c.topk,
                                                      kv_format=c.kv_format, d_v=c.d_v,
                                                      attn_sink=sink, indexer_mode=mode, path=path)
                res[f"{mode}_out"] = out.float().numpy()
                res[f"{mode}_lse"] = lse.numpy()
                res[f"{mode}_idx"] = idx.numpy()
            # gather_heads: the full-head result assembled on every rank (checks the helper too).
            res["gathered_lse"] = tp.gather_heads(lse).numpy()
            np.savez(os.path.join(outdir, f"job{j}_rank{rank}.npz"), **res)
    finally:
        dist.destroy_process_group()


def _uneven_gather_worker(rank: int, world: int, port: int, outdir: str, heads: int) -> None:
    """A manual head split by ``torch.tensor_split`` (uneven when ``world`` does not divide
    ``heads``), then ``gather_heads``: records the error each rank gets, then gathers an even
    split (rank r's shard filled with r) to show the group still works after the error."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        from torch_impl import tp

        q = torch.arange(heads, dtype=torch.float32).view(1, 1, heads, 1).expand(1, 1, heads, 3)
        mine = torch.tensor_split(q, world, dim=2)[rank].contiguous()
        err = ""
        try:
            tp.gather_heads(mine)
        except ValueError as e:
            err = str(e)
        even = torch.full((1, 1, 2, 3), float(rank))
        np.savez(os.path.join(outdir, f"uneven_rank{rank}.npz"), error=np.array(err),
                 gathered=tp.gather_heads(even).numpy())
    finally:
        dist.destroy_process_group()


def _start(fn, world: int, args: tuple) -> None:
    import multiprocessing

    import torch.multiprocessing as mp

    # forkserver: one fresh server process imports torch and the bindings once (imports dominate
    # on a slow disk), then forks the ranks from it; unlike plain fork, nothing is inherited from
    # the (possibly multithreaded, JAX-initialised) pytest process.
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["torch", "torch.distributed", "torch_impl", "torch_impl.tp", __name__])
    mp.start_processes(fn, args=(world, free_port()) + args, nprocs=world, join=True,
                       start_method="forkserver")


def run_uneven_gather(world: int, outdir: str, heads: int) -> list[dict]:
    """Run :func:`_uneven_gather_worker` on ``world`` gloo processes; per-rank result dicts."""
    _start(_uneven_gather_worker, world, (outdir, heads))
    return [dict(np.load(os.path.join(outdir, f"uneven_rank{r}.npz"))) for r in range(world)]


def run_workers(world: int, outdir: str, jobs: list) -> list[list[dict]]:
    """Run the TP step on ``world`` gloo processes for each ``(case_kw, path)`` job; returns
    ``results[job][rank]`` dicts of arrays."""
    _start(_worker, world, (outdir, jobs))
    return [[dict(np.load(os.path.join(outdir, f"job{j}_rank{r}.npz"))) for r in range(world)]
            for j in range(len(jobs))]
