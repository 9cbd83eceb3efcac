"""Point vLLM's and SGLang's DSA call sites at the compat entry points (docs/COMPAT.md).

:func:`patch_vllm` and :func:`patch_sglang` rebind, in the engine modules already imported (or
importable), the names their decode path calls, and open the capability gates that refuse
sm_120. Call one before the engine builds its model (before its worker imports the attention
backends is safest; names bound by ``from ... import`` in modules imported earlier are rebound
too). Each returns a :class:`Patch` that lists what it changed and can undo it.

Only names a module already has are replaced (a name missing from the installed version is
listed in ``Patch.missing``), so a version skew shows up in the record instead of as a silently
added attribute.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from typing import Mapping

import torch

from torch_impl.compat import deep_gemm as c_deep_gemm
from torch_impl.compat import flash_mla as c_flash_mla
from torch_impl.compat import topk as c_topk
from torch_impl.compat._names import own_names

__all__ = ["Patch", "patch_vllm", "patch_sglang", "VLLM_TARGETS", "SGLANG_TARGETS"]


def _supported() -> tuple[bool, None]:
    return True, None


def _true() -> bool:
    return True


# compat (DeepGEMM) argument name -> vLLM wrapper's (errors name the wrapper's arguments)
_VLLM_DG_NAMES = {"block_table": "block_tables", "schedule_meta": "schedule_metadata",
                  "max_context_len": "max_model_len"}


def vllm_fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                  schedule_metadata, max_model_len, clean_logits=False):
    """vLLM's ``vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits`` signature (``block_tables``,
    ``max_model_len``) over :func:`torch_impl.compat.deep_gemm.fp8_fp4_paged_mqa_logits`."""
    with own_names(_VLLM_DG_NAMES):
        return c_deep_gemm.fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens,
                                                    block_tables, schedule_metadata,
                                                    max_model_len, clean_logits)


def vllm_fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens, block_tables,
                              schedule_metadata, max_model_len, clean_logits=False):
    """vLLM's ``vllm.utils.deep_gemm.fp8_paged_mqa_logits`` signature."""
    with own_names({**_VLLM_DG_NAMES, "q": "q_fp8", "kv_cache": "kv_cache_fp8"}):
        return c_deep_gemm.fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens,
                                                block_tables, schedule_metadata, max_model_len,
                                                clean_logits)


def vllm_get_paged_mqa_logits_metadata(context_lens, block_size, num_sms, indices=None):
    """vLLM's ``vllm.utils.deep_gemm.get_paged_mqa_logits_metadata`` signature."""
    with own_names({"block_kv": "block_size"}):
        return c_deep_gemm.get_paged_mqa_logits_metadata(context_lens, block_size, num_sms,
                                                         indices)


_FLASH_MLA = {
    "FlashMLASchedMeta": c_flash_mla.FlashMLASchedMeta,
    "get_mla_metadata": c_flash_mla.get_mla_metadata,
    "flash_mla_with_kvcache": c_flash_mla.flash_mla_with_kvcache,
}
_DEEP_GEMM = {
    "get_paged_mqa_logits_metadata": c_deep_gemm.get_paged_mqa_logits_metadata,
    "fp8_paged_mqa_logits": c_deep_gemm.fp8_paged_mqa_logits,
    "fp8_fp4_paged_mqa_logits": c_deep_gemm.fp8_fp4_paged_mqa_logits,
}

# module -> {name: replacement}. vLLM's DeepGEMM wrappers have their own argument names
# (block_tables, max_model_len), hence the adapters above. vLLM 0.33 (docs/COMPAT.md names the files these came from):
# ops/flashmla.py re-exports FlashMLA's interface from its own extension module and gates sparse
# FlashMLA on compute capability family 90 / 100; utils/deep_gemm.py wraps DeepGEMM behind
# has_deep_gemm(); the indexer layer binds those names at import and calls the top-k ops.
VLLM_TARGETS: dict[str, dict[str, object]] = {
    "vllm.v1.attention.ops.flashmla": dict(_FLASH_MLA, is_flashmla_sparse_supported=_supported,
                                           _is_flashmla_available=_supported),
    "vllm.v1.attention.backends.mla.flashmla_sparse": dict(_FLASH_MLA),
    "vllm.utils.deep_gemm": dict(fp8_fp4_paged_mqa_logits=vllm_fp8_fp4_paged_mqa_logits,
                                 fp8_paged_mqa_logits=vllm_fp8_paged_mqa_logits,
                                 get_paged_mqa_logits_metadata=vllm_get_paged_mqa_logits_metadata,
                                 has_deep_gemm=_true),
    "vllm.model_executor.layers.sparse_attn_indexer": dict(
        fp8_fp4_paged_mqa_logits=vllm_fp8_fp4_paged_mqa_logits, has_deep_gemm=_true),
    "vllm.v1.attention.backends.mla.indexer": dict(
        get_paged_mqa_logits_metadata=vllm_get_paged_mqa_logits_metadata, has_deep_gemm=_true),
    "vllm._custom_ops": dict(top_k_per_row_decode=c_topk.top_k_per_row_decode),
}
# torch.ops._C ops vLLM's indexer calls directly (attributes of the op namespace).
VLLM_TORCH_OPS = {"persistent_topk": c_topk.persistent_topk,
                  "cooperative_topk": c_topk.cooperative_topk}

# SGLang (current release): the NSA backend imports sgl_kernel.flash_mla, the NSA indexer calls
# `deep_gemm.*` on the module and sgl_kernel's fast top-k.
SGLANG_TARGETS: dict[str, dict[str, object]] = {
    "sgl_kernel.flash_mla": dict(get_mla_metadata=c_flash_mla.get_mla_metadata,
                                 flash_mla_with_kvcache=c_flash_mla.flash_mla_with_kvcache),
    "deep_gemm": dict(_DEEP_GEMM, get_num_sms=c_deep_gemm.get_num_sms),
    "sgl_kernel": dict(fast_topk_v2=c_topk.fast_topk_v2,
                       fast_topk_transform_fused=c_topk.fast_topk_transform_fused),
}


@dataclasses.dataclass
class Patch:
    """What a patch changed: ``replaced`` ``(module, name)`` pairs, ``missing`` pairs the
    installed module lacks (left alone), ``absent`` modules not importable. :meth:`undo`
    restores every replaced attribute."""

    replaced: list = dataclasses.field(default_factory=list)
    missing: list = dataclasses.field(default_factory=list)
    absent: list = dataclasses.field(default_factory=list)
    _saved: list = dataclasses.field(default_factory=list, repr=False)
    _installed: list = dataclasses.field(default_factory=list, repr=False)

    def undo(self) -> None:
        for obj, name, old in reversed(self._saved):
            setattr(obj, name, old)
        self._saved.clear()
        for name in self._installed:
            sys.modules.pop(name, None)
        self._installed.clear()


def _module(name: str, modules: Mapping[str, types.ModuleType] | None, import_missing: bool):
    if modules is not None:
        return modules.get(name)
    if name in sys.modules:
        return sys.modules[name]
    if not import_missing:
        return None
    try:
        return importlib.import_module(name)
    except Exception:   # noqa: BLE001 - an engine module that fails to import is reported absent
        return None


def _apply(targets, patch: Patch, modules, import_missing: bool) -> None:
    for mod_name, names in targets.items():
        mod = _module(mod_name, modules, import_missing)
        if mod is None:
            patch.absent.append(mod_name)
            continue
        for name, new in names.items():
            if not hasattr(mod, name):
                patch.missing.append((mod_name, name))
                continue
            patch._saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, new)
            patch.replaced.append((mod_name, name))


def patch_vllm(*, modules: Mapping[str, types.ModuleType] | None = None,
               torch_ops_namespace=None, import_missing: bool = True) -> Patch:
    """Rebind vLLM's FlashMLA / DeepGEMM / top-k names to the compat entry points.

    Args:
      modules: ``{module name: module}`` to patch instead of importing vLLM's (tests pass
        stand-ins; None: ``sys.modules`` or import).
      torch_ops_namespace: the op namespace holding ``persistent_topk`` / ``cooperative_topk``
        (default ``torch.ops._C``, vLLM's extension); its attributes are replaced when present.
      import_missing: import engine modules not yet imported (True) or only patch loaded ones.
    Returns:
      the :class:`Patch` record.
    """
    patch = Patch()
    _apply(VLLM_TARGETS, patch, modules, import_missing)
    ns = torch.ops._C if torch_ops_namespace is None else torch_ops_namespace
    for name, fn in VLLM_TORCH_OPS.items():
        try:
            old = getattr(ns, name)
        except (AttributeError, RuntimeError):   # op not registered (vLLM's _C not loaded)
            patch.missing.append(("torch.ops._C", name))
            continue
        patch._saved.append((ns, name, old))
        setattr(ns, name, fn)
        patch.replaced.append(("torch.ops._C", name))
    return patch


def patch_sglang(*, modules: Mapping[str, types.ModuleType] | None = None,
                 import_missing: bool = True) -> Patch:
    """Rebind SGLang's ``sgl_kernel.flash_mla``, ``deep_gemm`` and ``sgl_kernel`` top-k names to
    the compat entry points. Where ``deep_gemm`` is not installed (sm_120 machines usually lack
    it) and ``modules`` is None, :mod:`torch_impl.compat.deep_gemm` is installed as
    ``sys.modules["deep_gemm"]``.

    Args / returns: as :func:`patch_vllm`.
    """
    patch = Patch()
    targets = dict(SGLANG_TARGETS)
    if modules is None and _module("deep_gemm", None, import_missing) is None:
        sys.modules["deep_gemm"] = c_deep_gemm
        patch._installed.append("deep_gemm")
        patch.replaced.append(("deep_gemm", "<module>"))
        del targets["deep_gemm"]
    _apply(targets, patch, modules, import_missing)
    return patch
