"""Thread-block-cluster primitives for the sm_90 Gluon kernels, as inline PTX, and the reading of
shared-memory offsets off a compiled kernel's PTX.

Gluon (Triton 3.6) has no cluster operations a warp-specialised kernel can use: a cross-CTA
``convert_layout`` does not lower (``ConvertTritonGPUToLLVM`` fails), a layout broadcast over the
CTAs of a ``num_ctas=2`` kernel masks every global store to CTA 0, and a shared-memory buffer
has no address a program can read. So the crossover kernel (``gluon_xo.py``) is compiled as an
ordinary one-CTA kernel, launched in clusters of :data:`CLUSTER` CTAs (:func:`launch`: the
compiled kernel's ``packed_metadata``), and reaches its peer's shared memory through the PTX
below: ``mapa`` turns a local shared address into the peer's, ``cp.async.bulk`` copies a local
region into the peer's and completes bytes on the peer's mbarrier, ``mbarrier.arrive`` at
cluster scope signals the peer. A local shared address is ``global_smem`` (the kernel's dynamic
shared memory, the symbol Triton's PTX declares) plus the buffer's offset; the offsets come from
the compiled PTX (:func:`mbarrier_inits`): the kernel initialises and at once invalidates an
mbarrier at the start of each buffer whose address it needs (PTX: memory may hold an mbarrier
object and be reused once it is invalidated), so each buffer's offset appears as an operand of
an ``mbarrier.init`` the launcher can read, in program order.

Semantics: PTX ISA 8.0+, sm_90 (``barrier.cluster``, ``mapa``, ``cp.async.bulk.shared::cluster``,
``mbarrier.arrive.release.cluster``); the tx-count of an mbarrier may go negative within a phase
(a peer's bytes may land before the local ``expect_tx``), as the ISA allows.
"""
from __future__ import annotations

import re

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

CLUSTER = 2        # CTAs in a cluster (the pair that shares a row block)
CLUSTER_CTAS = gl.constexpr(CLUSTER)
# The Triton release the cluster kernels are written against: its PTX conventions (the offsets
# :func:`mbarrier_inits` reads, ``global_smem``) and its Gluon frontend (Triton 3.9 renamed
# ``shared_memory_descriptor._reinterpret``, so ``gluon_xo`` / ``gluon_xs`` do not compile there).
CLUSTER_TRITON = "3.6"


def cluster_kernels_supported(version: str | None = None) -> bool:
    """Whether the crossover kernels (``gluon_xo``, ``gluon_xs``) can be compiled and launched
    with Triton ``version`` (default: the one imported): the :data:`CLUSTER_TRITON` releases."""
    if version is None:
        import triton
        version = triton.__version__
    return version == CLUSTER_TRITON or version.startswith(CLUSTER_TRITON + ".")


@gluon.jit
def _cta_rank():
    """This CTA's rank in its cluster (``%cluster_ctarank``), an int32 scalar."""
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _cluster_sync(RELAXED: gl.constexpr = False):
    """Every thread of the cluster arrives and waits (acquire): a partition calls it with all
    its threads, and every partition of both CTAs must call it the same number of times
    (``barrier.cluster`` counts every non-exited thread of the cluster). The arrive releases
    this thread's earlier memory operations (a ``MEMBAR.ALL.GPU`` each); ``RELAXED`` drops that,
    for the first barrier, whose ordering (the ``mbarrier.init``s) comes from
    ``fence.mbarrier_init.release.cluster`` (CUTLASS's ``cluster_arrive_relaxed`` after
    ``fence_barrier_init``)."""
    SEM: gl.constexpr = "relaxed" if RELAXED else "release"
    gl.inline_asm_elementwise(
        f"barrier.cluster.arrive.{SEM}.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n\t"
        "mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _require_cluster(N: gl.constexpr):
    """Trap unless the kernel was launched in clusters of ``N`` CTAs: launched plainly, ptxas's
    ``barrier.cluster`` falls back to a CTA barrier (barrier 0, which a partition also uses) and
    ``mapa`` to rank 1 faults, so the kernel would hang or misbehave instead of failing."""
    gl.inline_asm_elementwise(
        "{\n\t.reg .b32 n;\n\t.reg .pred p;\n\tmov.u32 n, %cluster_nctarank;\n\t"
        f"setp.ne.u32 p, n, {N};\n\t@p trap;\n\tmov.u32 $0, 0;\n\t}}",
        "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _probe(buf):
    """Initialise and at once invalidate an mbarrier on the first 8 bytes of ``buf`` (before
    the buffer's first use): its ``mbarrier.init`` operand tells the launcher the buffer's
    shared-memory offset (:func:`mbarrier_inits`)."""
    v = buf._reinterpret(gl.int64, [8, 1], mbarrier.MBarrierLayout())
    mbarrier.init(v.index(0), count=1)
    mbarrier.invalidate(v.index(0))


@gluon.jit
def _fence_mbarrier_init():
    """Make this CTA's ``mbarrier.init`` visible to the cluster (before the first
    :func:`_cluster_sync`)."""
    gl.inline_asm_elementwise("fence.mbarrier_init.release.cluster;\n\tmov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _smem_base():
    """The shared-window address of ``global_smem`` (int32 scalar). Called once, before the
    partitions: a ``global_smem`` reference inside a partition's loop made ptxas build that
    loop's ~70 wgmma descriptors in ordinary registers and spill them (752 -> 1,069 SASS a block
    in the consumer, AOT); the partitions read the address from shared memory instead."""
    return gl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _meta_word(meta, i: gl.constexpr):
    """Word ``i`` of a ``[4]`` int32 shared buffer as a scalar (the addresses a kernel stored
    there before its partitions: an opaque load, so no ``global_smem`` in the partition)."""
    L: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    v = meta.load(L)
    return gl.sum(gl.where(gl.arange(0, 4, layout=L) == i, v, 0), axis=0)


@gluon.jit
def _lanes(NW: gl.constexpr):
    """``[32 NW]`` int32, element i held by thread i of a partition of ``NW`` warps: the
    operand that elects one thread (element 0) of the elementwise PTX below."""
    return gl.arange(0, 32 * NW, layout=gl.BlockedLayout([1], [32], [NW], [0]))


@gluon.jit
def _peer_arrive(addr, lanes):
    """The thread holding ``lanes == 0`` arrives on the mbarrier at the *other* CTA's copy of this
    CTA's shared address ``addr`` (cluster of two: rank ^ 1), with the default semantics
    (release, CTA scope), as CUTLASS's ``ClusterBarrier::arrive(cta_id)`` releases a multicast
    pipeline stage: ``.release.cluster`` costs a ``MEMBAR.ALL.GPU`` on every arrival (AOT), and
    what is released here are shared-memory reads the caller's wgmma wait has completed."""
    gl.inline_asm_elementwise(
        "{\n\t.reg .b32 ra, t;\n\t.reg .pred p;\n\tmov.u32 t, %cluster_ctarank;\n\t"
        "xor.b32 t, t, 1;\n\tmapa.shared::cluster.u32 ra, $1, t;\n\tsetp.eq.u32 p, $2, 0;\n\t"
        "@p mbarrier.arrive.shared::cluster.b64 _, [ra];\n\tmov.u32 $0, 0;\n\t}",
        "=r,r,r", [addr, lanes], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _copy_to_peer(src, bar, lanes, NBYTES: gl.constexpr):
    """The thread holding ``lanes == 0`` copies ``NBYTES`` of this CTA's shared memory at
    address ``src`` to the same address of the other CTA's (``cp.async.bulk``, async proxy),
    completing ``NBYTES`` on the other CTA's copy of the mbarrier at ``bar``. ``src`` and
    ``NBYTES`` are multiples of 16; the caller has fenced its generic-proxy stores of the region
    (``fence_async_shared``) and joined its threads (a barrier) first."""
    gl.inline_asm_elementwise(
        "{\n\t.reg .b32 rs, rb, t;\n\t.reg .pred p;\n\tmov.u32 t, %cluster_ctarank;\n\t"
        "xor.b32 t, t, 1;\n\tmapa.shared::cluster.u32 rs, $1, t;\n\t"
        "mapa.shared::cluster.u32 rb, $2, t;\n\tsetp.eq.u32 p, $3, 0;\n\t"
        "@p cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [rs], [$1], "
        "$4, [rb];\n\tmov.u32 $0, 0;\n\t}",
        "=r,r,r,r,n", [src, bar, lanes, NBYTES], dtype=gl.int32, is_pure=False, pack=1)


_INIT = re.compile(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[(%r\d+)(?:\+(\d+))?\],\s*(\d+)")


def mbarrier_inits(ptx: str) -> list[tuple[int, int]]:
    """``(byte offset from global_smem, arrival count)`` of every ``mbarrier.init`` of a
    kernel's PTX, in program order. Each operand register must be ``global_smem`` itself or a
    chain of ``add.s32 / add.u32`` of immediates onto it (what Triton's lowering emits);
    anything else raises ``ValueError`` (the caller then refuses the kernel rather than guess an
    address)."""
    base = set(re.findall(r"mov\.(?:b32|u32)\s+(%r\d+),\s*global_smem;", ptx))
    if not base:
        raise ValueError("no `mov.b32 %r, global_smem` in the PTX: cannot read shared offsets")
    adds = {m.group(1): (m.group(2), int(m.group(3))) for m in re.finditer(
        r"add\.(?:s32|u32)\s+(%r\d+),\s*(%r\d+),\s*(\d+);", ptx)}

    def resolve(reg: str, depth: int = 0) -> int:
        if reg in base:
            return 0
        if reg not in adds or depth > 8:
            raise ValueError(f"shared address {reg} is not global_smem + an immediate")
        src, imm = adds[reg]
        return resolve(src, depth + 1) + imm

    return [(resolve(m.group(1)) + int(m.group(2) or 0), int(m.group(3)))
            for m in _INIT.finditer(ptx)]


_OFFSETS: dict = {}     # compiled kernel hash -> the offsets read off its PTX


def launch(fn, grid: tuple, args: tuple, kwargs: dict, n_offsets: int, read_offsets) -> tuple:
    """Launch the Gluon kernel ``fn`` over ``grid`` in clusters of :data:`CLUSTER` CTAs along
    axis 0 (``grid[0]`` a multiple of it), with ``args`` followed by ``n_offsets`` shared-memory
    offsets: ``read_offsets(ptx)`` of the compiled kernel, once per compiled kernel (the kernel
    must not specialise on them, ``do_not_specialize``, so the first compile, with zeros, is the
    one launched; ``read_offsets`` raises ``ValueError`` where it cannot read them).

    The kernel is compiled as one CTA (``num_ctas`` 1: Gluon's layouts stay per CTA) and
    launched through Triton's own launcher with the cluster size in its packed metadata: Triton
    launches ``gridX * num_ctas`` CTAs with a cluster dimension of ``num_ctas``
    (``cuLaunchKernelEx``), so a cluster is CTAs ``(2c, 2c + 1)`` of axis 0 and
    ``%cluster_ctarank`` is ``ctaid.x % 2``. Binds the arguments twice (``warmup``, then the
    launch): host time of an eager call, none in a replayed CUDA graph. Returns the offsets.

    Raises ``ValueError`` for ``grid[0]`` not a multiple of :data:`CLUSTER`,
    ``NotImplementedError`` (naming the Triton version) where the offsets cannot be read (a
    kernel cache without PTX, another PTX shape) or the kernel needs global / profile scratch
    (Triton sizes it by the compiled ``num_ctas``)."""
    if grid[0] % CLUSTER:
        raise ValueError(f"grid[0] must be a multiple of the cluster size {CLUSTER}, "
                         f"got {grid[0]}")
    k = fn.warmup(*args, *([0] * n_offsets), grid=grid, **kwargs)
    if hasattr(k, "result"):
        k = k.result()
    md = k.metadata
    offs = _OFFSETS.get(k.hash)
    if offs is None:
        import triton
        why = None
        if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
            why = "the kernel needs global / profile scratch, which a cluster launch under-sizes"
        else:
            try:
                offs = tuple(read_offsets(k.asm["ptx"]))
            except (KeyError, ValueError) as e:     # KeyError: a cache that keeps no PTX
                why = f"its shared-memory offsets cannot be read ({type(e).__name__}: {e})"
        if why:
            raise NotImplementedError(
                f"a cluster launch of {k.name} with Triton {triton.__version__}: {why} "
                f"(supported: Triton 3.6's PTX, a kernel cache that keeps it)")
        if len(offs) != n_offsets:
            raise ValueError(f"read_offsets gave {len(offs)} offsets, expected {n_offsets}")
        _OFFSETS[k.hash] = offs
    k.packed_metadata = (md.num_warps, CLUSTER, md.shared)
    fn[(grid[0] // CLUSTER,) + tuple(grid[1:])](*args, *offs, **kwargs)
    return offs


# ----------------------------------------------------------------- self-test (GPU, sm_90)


@gluon.jit(do_not_specialize=["x_off", "bar_off", "ack_off"])
def _cluster_selftest_kernel(src_ptr, out_ptr, x_off, bar_off, ack_off):
    """The primitives above on their own (4 warps, clusters of two): CTA ``r`` of cluster ``c``
    loads rows ``[32 r, 32 r + 32)`` of the cluster's ``[64, 64]`` fp16 tile ``src[64 c:]`` into
    its half of a 128-byte-swizzled ``[64, 64]`` shared tile, copies that half into the peer's
    tile (:func:`_copy_to_peer`, completing on the peer's ``bar``), waits for the peer's half,
    writes the whole tile it now holds to ``out[2 c + r]``, then arrives on the peer's ``ack``
    (:func:`_peer_arrive`) and waits on its own. Offsets (the launcher's, from the PTX): the
    tile, ``bar``, ``ack``."""
    _require_cluster(CLUSTER_CTAS)
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    x = gl.allocate_shared_memory(gl.float16, [2, 32, 64], SH)
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    ack = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    _probe(x)
    mbarrier.init(bar.index(0), count=1)
    mbarrier.init(ack.index(0), count=1)
    _fence_mbarrier_init()
    _cluster_sync(True)
    rank = _cta_rank()
    cta = gl.program_id(0)
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, L))
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, L)) + 32 * rank + (cta // 2) * 64
    x.index(rank).store(gl.load(src_ptr + r[:, None] * 64 + c[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.expect(bar.index(0), 4096)
    base = _smem_base()
    lanes = _lanes(4)
    _copy_to_peer(base + x_off + rank * 4096, base + bar_off, lanes, 4096)
    mbarrier.wait(bar.index(0), 0)
    w = x._reinterpret(gl.float16, [64, 64], SH).load(L)
    r64 = gl.arange(0, 64, layout=gl.SliceLayout(1, L))
    gl.store(out_ptr + cta * 4096 + r64[:, None] * 64 + c[None, :], w)
    _peer_arrive(base + ack_off, lanes)
    mbarrier.wait(ack.index(0), 0)
    _cluster_sync()


def _selftest_offsets(ptx: str) -> tuple[int, int, int]:
    """``(tile, bar, ack)`` offsets of the self-test kernel: its three ``mbarrier.init``s (count
    1 each) in program order."""
    inits = mbarrier_inits(ptx)
    if [c for _, c in inits] != [1, 1, 1]:
        raise ValueError(f"expected three mbarrier.init of count 1, found {inits}")
    return tuple(o for o, _ in inits)


def cluster_selftest(clusters: int = 4, device: str = "cuda") -> dict:
    """Run :func:`_cluster_selftest_kernel` on ``clusters`` clusters (sm_90) and compare what
    each CTA holds with its cluster's tile: ``{"ok", "mismatched_ctas", "offsets"}``. The first
    GPU check of a cluster kernel's building blocks (``python -m
    kernels.sparse_mla.gluon_cluster``)."""
    import torch
    src = torch.randn(clusters * 64, 64, device=device).to(torch.float16)
    out = torch.full((2 * clusters, 64, 64), float("nan"), dtype=torch.float16, device=device)
    offsets = launch(_cluster_selftest_kernel, (2 * clusters,), (src, out), {"num_warps": 4}, 3,
                     _selftest_offsets)
    torch.cuda.synchronize()
    want = src.view(clusters, 1, 64, 64).expand(clusters, 2, 64, 64).reshape(2 * clusters, 64, 64)
    bad = [i for i in range(2 * clusters) if not torch.equal(out[i], want[i])]
    return {"ok": not bad, "mismatched_ctas": bad, "offsets": offsets}


if __name__ == "__main__":
    print(cluster_selftest())
