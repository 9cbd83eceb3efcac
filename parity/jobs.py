"""Worker of ``python -m parity --jobs N`` (a module of its own: spawned workers import their
target by module name, and ``parity.__main__`` runs as ``__main__`` in the parent)."""
from __future__ import annotations


def run_shard(argv: list, shard: int, jobs: int) -> list:
    """Run cases ``shard::jobs`` of the grid that ``argv`` selects; returns ``[(case_index,
    rows)]`` (one ``run_suite`` per case, so the parent merges rows back in case order)."""
    from parity import runners as _runners
    from parity.__main__ import build_parser, run_suite

    args = build_parser().parse_args(argv)
    gpu = _runners.prepare_environment()
    from parity import cases as pcases
    selected = _runners.select(args.backend, args.path)
    cases = pcases.filter_grid(pcases.build_grid(mode=args.mode, gpu=gpu, seed=args.seed),
                               pattern=args.pattern, ops=args.op, names=args.cases)
    repeat = pcases.sizes_for(args.mode, gpu).repeat
    return [(ci, run_suite([cases[ci]], selected, seed=args.seed, mode=args.mode, repeat=repeat))
            for ci in range(shard, len(cases), jobs)]
