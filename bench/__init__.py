"""``python -m bench``: roofline benchmark of the DSA decode ops on this GPU.

Times every available path (torch: ``triton``, ``torch``; jax: ``pallas``, ``xla``) of
``indexer_topk``, ``sparse_mla_decode`` and the composed decode step over a grid of the
DeepSeek-V3.2 and V4-Flash presets, checks every timed output against ``kernels.reference``
(on a slice) or against another path (on the full shape) first, and reports median / p20 / p80
microseconds, GB/s, TFLOP/s and the fraction of the roofline floor computed from the bytes and
FLOPs each op must move and do (:mod:`bench.roofline`). ``--write-dispatch`` turns the
measurements into ``kernels/dispatch/<arch>.json``, the table ``path="auto"`` reads.

Modules: ``grid`` (the shapes), ``roofline`` (floor formulas, machine peak measurement),
``inputs`` (device-side input generation and reference slices), ``paths`` (discovery of the
op paths, one adapter per backend), ``timing``, ``checks``, ``report`` (table, JSON, plot,
dispatch table), ``runner`` (the loop), ``__main__`` (CLI). Nothing in the project imports bench.
"""
