"""The parity suite: ``python -m parity`` runs every available path of both backends (torch:
triton, torch; jax: pallas, xla) on a grid of named cases against the float64 NumPy reference
(``kernels.reference``) and against each other, with the SPEC tolerances of ``kernels.compare``.

Modules: ``cases`` (the grid, built from ``kernels.cases``), ``runners`` (one NumPy-in /
NumPy-out adapter per backend and path), ``checks`` (which ``kernels.compare`` check each op
gets), ``report`` (table and JSON), ``__main__`` (the command line). Nothing imports parity.
"""
