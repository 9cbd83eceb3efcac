"""Byte layouts of the fp8 caches (docs/SPEC.md "Cache layouts"), one descriptor per format.

Every other statement of these layouts derives from the descriptors here: the NumPy writers and
readers of ``kernels.formats`` (the definition the kernels are tested against), the byte offsets
the Triton and Pallas kernels compile in (as constexprs), and the benchmark's fast writers
(``bench/inputs.py``). ``tests/test_formats.py`` packs each format's fields by its descriptor
and compares the result with ``kernels.formats``' writers byte for byte.

A page of P tokens is P *data rows* and then, for the formats with a separate scale area, P
*scale rows*, the whole rounded up to ``page_align`` bytes::

    fp8_ds_mla   data row 656 B: nope e4m3 x 512 @ 0 | scale float32 x 4 @ 512 | rope bf16 x 64 @ 528
    fp8_model1   data row 576 B: nope e4m3 x 448 @ 0 | rope bf16 x 64 @ 448
                 scale row  8 B: scale ue8m0 x 7 @ 0 | pad x 1 @ 7;  page rounded up to 576 B
    fp8_indexer  data row D_I B: k e4m3 x D_I @ 0
                 scale row  4 B: scale float32 x 1 @ 0

A scale multiplies ``tile`` consecutive dims of the e4m3 field (``nope`` / ``k``). Standard
library only, so kernel modules import it at no cost.

Sources: FlashMLA ``tests/quant.py`` (V32_FP8Sparse, MODEL1_FP8Sparse), DeepGEMM
``fp8_paged_mqa_logits`` (the indexer cache).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

ITEMSIZE = {"e4m3": 1, "ue8m0": 1, "pad": 1, "bfloat16": 2, "float32": 4}
"""Bytes per element of each field dtype (``pad``: bytes written as zero, never read)."""


@dataclass(frozen=True)
class Field:
    """``count`` elements of ``dtype`` starting ``offset`` bytes into their row."""

    name: str
    dtype: str
    count: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.count * ITEMSIZE[self.dtype]

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def index(self, unit: int) -> int:
        """The field's offset in ``unit``-byte words (the kernels address the bf16 rope through
        an int16 view and float32 scales through a float32 view of the same bytes)."""
        if self.offset % unit:
            raise ValueError(f"{self.name} at byte {self.offset} is not {unit}-byte aligned")
        return self.offset // unit


@dataclass(frozen=True)
class Row:
    """One row of ``nbytes`` bytes holding ``fields`` in order, without gaps."""

    nbytes: int
    fields: tuple

    def __post_init__(self):
        at = 0
        for f in self.fields:
            if f.offset != at:
                raise ValueError(f"{f.name}: expected offset {at}, got {f.offset}")
            at = f.end
        if at != self.nbytes:
            raise ValueError(f"row of {self.nbytes} bytes: fields end at {at}")

    def stride(self, unit: int) -> int:
        """The row's length in ``unit``-byte words."""
        if self.nbytes % unit:
            raise ValueError(f"a {self.nbytes}-byte row is not a whole number of {unit}-byte words")
        return self.nbytes // unit


@dataclass(frozen=True)
class Layout:
    """A cache format: per page P data rows, then (``scale`` not None) P scale rows, rounded up
    to a multiple of ``page_align`` bytes. ``tile``: dims of the e4m3 field per scale."""

    name: str
    data: Row
    scale: Row | None
    tile: int
    page_align: int = 1

    def field(self, name: str) -> Field:
        """The field called ``name`` in the data or the scale row (KeyError if none)."""
        for row in (self.data, self.scale):
            for f in (row.fields if row is not None else ()):
                if f.name == name:
                    return f
        raise KeyError(f"{self.name} has no field {name!r}")

    @property
    def token_bytes(self) -> int:
        """Bytes of one token (its data row plus its scale row)."""
        return self.data.nbytes + (self.scale.nbytes if self.scale is not None else 0)

    def page_bytes(self, page_size: int) -> int:
        """Bytes of a page of ``page_size`` tokens."""
        raw = page_size * self.token_bytes
        return -(-raw // self.page_align) * self.page_align

    def data_offset(self, off: int) -> int:
        """Byte offset, within its page, of token ``off``'s data row."""
        return off * self.data.nbytes

    def scale_offset(self, page_size: int, off: int) -> int:
        """Byte offset, within its page, of token ``off``'s scale row."""
        return page_size * self.data.nbytes + off * self.scale.nbytes


FP8_DS_MLA = Layout(
    "fp8_ds_mla",
    data=Row(656, (Field("nope", "e4m3", 512, 0), Field("scale", "float32", 4, 512),
                   Field("rope", "bfloat16", 64, 528))),
    scale=None, tile=128)
"""DeepSeek-V3.2 ``fp8_ds_mla``: per token 512 e4m3 nope dims, 4 float32 scales (one per 128
dims, powers of two), 64 bf16 rope dims; pages are P rows of 656 bytes."""

FP8_MODEL1 = Layout(
    "fp8_model1",
    data=Row(576, (Field("nope", "e4m3", 448, 0), Field("rope", "bfloat16", 64, 448))),
    scale=Row(8, (Field("scale", "ue8m0", 7, 0), Field("pad", "pad", 1, 7))),
    tile=64, page_align=576)
"""DeepSeek-V4-Flash ``fp8_model1``: per page P data rows (448 e4m3 nope dims, 64 bf16 rope
dims), then P scale rows (7 ue8m0 scales, one per 64 dims, and a zero pad byte); the page is
rounded up to a multiple of 576 bytes (FlashMLA's allocation)."""


@functools.lru_cache(maxsize=None)
def fp8_indexer(head_dim: int = 128) -> Layout:
    """The indexer key cache for ``D_I = head_dim`` (DeepGEMM paged MQA layout): per page P rows
    of D_I e4m3 bytes, then P float32 scales (one per token)."""
    return Layout("fp8_indexer", data=Row(head_dim, (Field("k", "e4m3", head_dim, 0),)),
                  scale=Row(4, (Field("scale", "float32", 1, 0),)), tile=head_dim)


FP8_INDEXER = fp8_indexer(128)
"""The indexer cache of both models (D_I = 128): 132 bytes per token."""

LAYOUTS = {"fp8_ds_mla": FP8_DS_MLA, "fp8_model1": FP8_MODEL1, "fp8_indexer": FP8_INDEXER}
