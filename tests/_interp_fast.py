"""Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests) without two pieces of repeated
work; the same interpreted operations run, so what the tests check is unchanged.

Installed by tests/conftest.py in every pytest process and by tests/_tp_worker.py in its rank
processes, on machines without a GPU; ``DSA_TESTS_PLAIN_INTERPRETER=1`` leaves the interpreter as
shipped (to rule this out when debugging). Written against ``triton.runtime.interpreter`` of
Triton 3.9; with a Triton whose interpreter lacks the names used here, nothing is changed.

1. Re-patching per helper call. ``InterpretedFunction.__call__`` (every call of a
   ``@triton.jit`` helper inside a kernel, thousands a launch) runs ``_patch_lang``: an
   ``inspect.getmembers`` scan of ``tl``, ``tl.tensor``, ``tl.math`` and
   ``tensor_descriptor_base`` replacing each builtin found with an interpreter closure, and a
   reset of the same stateless closures (``range``, ``reduce``, ``tensor.__index__``, ...).
   Within one launch (``GridExecutor.__call__``, whose own ``_patch_lang`` patched the kernel's
   language modules) a rescan of a module already patched in that launch finds no builtin left,
   so only the closures are set again, to equal ones. Here a helper call whose language modules
   (``tl`` / ``tl.core`` among its globals) were all patched in the running launch skips it; the
   first call with another module (``tl.core``, the globals of ``tl.max`` / ``tl.sum`` /
   ``tl.zeros``) still patches as before, and the launch's restore is unchanged. It was ~20 % of
   a Triton-interpreter test's time (cProfile of
   ``test_fp8_cache_strided_pages[fp8_model1-slots]``, 2026-12-07).
2. ``_get_np_dtype`` (tl dtype -> the NumPy dtype holding it) builds its 19-entry table on
   every call: ~1.2 M calls and ~11 % of tests/test_torch_topk.py's time (cProfile). Same
   lookups here (a pointer or a block of pointers: the original's uint64; a block: its element
   type's), each scalar type's answer asked of the original once and kept; a type it does not
   know still raises its ``KeyError``.

Measured together with one BLAS / OpenMP thread per xdist worker (tests/conftest.py):
tests/test_torch_topk.py, test_torch_indexer.py and test_compat_topk.py with ``-n 2`` on the
2-core CI machine 167.6 -> 93.6 s (tests/TEST_TIME.md, run CC).
"""
from __future__ import annotations

import inspect
import os


def speed_up_triton_interpreter() -> bool:
    """Install both changes if Triton interprets here (``TRITON_INTERPRET`` set) and
    ``DSA_TESTS_PLAIN_INTERPRETER`` is unset; True if installed (now or before)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    if os.environ.get("DSA_TESTS_PLAIN_INTERPRETER", "") not in ("", "0"):
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    if getattr(ti._patch_lang, "_dsa_tests", False):
        return True
    if not all(hasattr(ti, n) for n in ("GridExecutor", "_patch_lang", "_LangPatchScope",
                                        "_get_np_dtype")):
        return False
    _patch_once_per_launch(ti, tl)
    _table_np_dtype(ti, tl)
    return True


def _patch_once_per_launch(ti, tl) -> None:
    patch_lang, grid_call = ti._patch_lang, ti.GridExecutor.__call__
    patched = []        # per running launch: ids of the language modules patched in it so far
    known = {}          # function -> ids of the language modules its globals hold

    def langs(fn) -> frozenset:
        if fn not in known:
            known[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                  if inspect.ismodule(v) and v in (tl, tl.core))
        return known[fn]

    def once_per_launch(fn):
        if not patched:                              # outside a launch: as shipped
            return patch_lang(fn)
        mods = langs(fn)
        if patched[-1] is not None and mods and mods <= patched[-1]:
            return ti._LangPatchScope()              # nothing left to patch; nothing to restore
        scope = patch_lang(fn)
        patched[-1] = (patched[-1] or frozenset()) | mods
        return scope

    def launch(self, *args, **kwargs):
        patched.append(None)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    once_per_launch._dsa_tests = True
    ti._patch_lang = once_per_launch
    ti.GridExecutor.__call__ = launch


def _table_np_dtype(ti, tl) -> None:
    get_np_dtype, table = ti._get_np_dtype, {}

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type) and not isinstance(tt_dtype.element_ty,
                                                                 tl.pointer_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, (tl.pointer_type, tl.block_type)):
            return get_np_dtype(tt_dtype)
        try:
            return table[tt_dtype]
        except KeyError:
            table[tt_dtype] = found = get_np_dtype(tt_dtype)
            return found
        except TypeError:                            # unhashable: the original's answer
            return get_np_dtype(tt_dtype)

    ti._get_np_dtype = np_dtype
