"""Declarative hardware gates shared by both backends.

Each kernel path says which compute capabilities it supports; a launcher calls
:func:`require_arch` / :func:`require_smem` before launch so an unsupported GPU gets a
``NotImplementedError`` naming the GPU, its compute capability and what is supported.

Shared-memory limits are the opt-in maximum per block from the CUDA programming guide's
compute-capability table (sm_80 163 KiB, sm_86/89/120 99 KiB, sm_90/100 227 KiB).
"""
from __future__ import annotations

from dataclasses import dataclass

# Opt-in shared memory per block, bytes.
SMEM_PER_BLOCK = {
    (8, 0): 166_912,
    (8, 6): 101_376,
    (8, 7): 166_912,
    (8, 9): 101_376,
    (9, 0): 232_448,
    (10, 0): 232_448,
    (10, 3): 232_448,
    (12, 0): 101_376,
    (12, 1): 101_376,
}

# Compute capabilities the Triton / Pallas-Triton kernels are built and checked for (fp8 e4m3
# needs sm_89+; the interpreter on CPU is always allowed).
SUPPORTED_CC = ((8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1))


@dataclass(frozen=True)
class DeviceInfo:
    """What a launcher needs to know about the GPU it launches on.

    ``name`` is the marketing name (``"NVIDIA H200"``), ``cc`` the compute capability,
    ``num_sms`` the multiprocessor count, ``smem_per_block`` the opt-in shared-memory limit.
    ``interpret`` is True for the CPU interpreter (``TRITON_INTERPRET=1`` or Pallas interpret).
    """

    name: str
    cc: tuple[int, int]
    num_sms: int
    smem_per_block: int
    interpret: bool = False

    @property
    def arch(self) -> str:
        """``"sm_90"`` style architecture tag (``"interpreter"`` on the CPU)."""
        return "interpreter" if self.interpret else f"sm_{self.cc[0]}{self.cc[1]}"


CPU_INTERPRETER = DeviceInfo(name="CPU interpreter", cc=(0, 0), num_sms=4,
                             smem_per_block=232_448, interpret=True)


def smem_limit(cc: tuple[int, int]) -> int:
    """Opt-in shared memory per block for compute capability ``cc`` (conservative 99 KiB default)."""
    return SMEM_PER_BLOCK.get(tuple(cc), 101_376)


def require_arch(dev: DeviceInfo, what: str, supported=SUPPORTED_CC) -> None:
    """Raise ``NotImplementedError`` unless ``dev`` can run ``what``.

    Raises:
      NotImplementedError: names the GPU, its compute capability and the supported list.
    """
    if dev.interpret or tuple(dev.cc) in supported:
        return
    names = ", ".join(f"sm_{a}{b}" for a, b in supported)
    raise NotImplementedError(
        f"{what} does not run on {dev.name} (compute capability {dev.cc[0]}.{dev.cc[1]}); "
        f"supported: {names}")


def require_smem(dev: DeviceInfo, what: str, need_bytes: int) -> None:
    """Raise ``NotImplementedError`` when a config needs more shared memory than ``dev`` has."""
    if dev.interpret or need_bytes <= dev.smem_per_block:
        return
    raise NotImplementedError(
        f"{what} needs {need_bytes} bytes of shared memory per block but {dev.name} "
        f"(compute capability {dev.cc[0]}.{dev.cc[1]}) allows {dev.smem_per_block}")


INT32_BYTES = 2 ** 31 - 1


def require_int32_addressing(dev: DeviceInfo, what: str, nbytes: int, *, itemsize: int = 1,
                             wide_offsets: bool | None = None) -> None:
    """Raise ``NotImplementedError`` when a buffer of ``nbytes`` (elements of ``itemsize``
    bytes) cannot be addressed by the Pallas-Triton lowering. The lowering computes offsets in
    elements, 64-bit for arrays over 2^32 bytes and else 32-bit (sign-extended): an array of
    more than 2^31 - 1 elements within 2^32 bytes (a 2-4 GiB uint8 cache) wrapped (illegal
    address on the H200 at DSV32 B=128, L=32K, fp8_ds_mla, 2.75 GB). ``wide_offsets``: the
    caller's lowering emits 64-bit offsets for that window too
    (``kernels._pallas_call.WIDE_OFFSETS``), so nothing is refused; without it only the
    window is. ``None`` (callers whose kernels are not checked beyond 2 GiB, e.g. the indexer):
    every buffer over 2^31 - 1 bytes is refused. ``path="auto"`` then falls through to the XLA
    path."""
    elements = nbytes // max(1, itemsize)
    if dev.interpret or nbytes <= INT32_BYTES:
        return
    if wide_offsets is None:
        raise NotImplementedError(
            f"{what}: a {nbytes / 2**30:.2f} GiB buffer needs 64-bit offsets, which the "
            f"Pallas-Triton lowering does not emit on {dev.name} (compute capability "
            f"{dev.cc[0]}.{dev.cc[1]}); supported: buffers under 2 GiB (use path='xla' or the "
            f"torch backend)")
    if wide_offsets or elements <= INT32_BYTES or nbytes > 2 ** 32:
        return
    raise NotImplementedError(
        f"{what}: a {nbytes / 2**30:.2f} GiB buffer of {elements} elements needs 64-bit "
        f"offsets, which the Pallas-Triton lowering does not emit for arrays of 2^31 or more "
        f"elements within 2^32 bytes on {dev.name} (compute capability {dev.cc[0]}.{dev.cc[1]}); "
        f"supported: under 2^31 elements or over 4 GiB (use path='xla' or the torch backend)")
