"""The argument checks of ``dsa_decode_step`` in both bindings: ``window`` (the V4-Flash sliding
window), the shared page pool of the two caches, and every argument under the step's own name
(``idx_q``, ``idx_weights``; q and idx_q of different B / N), refused before either op runs. Its
values, with the window, on every path: tests/test_contract.py."""
import numpy as np
import pytest

from kernels import DSV4_FLASH
from parity.cases import make_step_case

TOPK, WINDOW = 16, 8


def _case():
    # request 1 holds N = 2 .. 8 positions: fewer than the window, so its indexer sees none
    return make_step_case(11, name="window", preset=DSV4_FLASH, B=2, N=2, H=16, topk=TOPK,
                          context=96, q_dtype="float32", H_I=8, P=16)


def _step(backend):
    if backend == "torch":
        ti = pytest.importorskip("torch_impl")
        from torch_impl._common import as_tensor
        return ti.dsa_decode_step, as_tensor
    jx = pytest.importorskip("jax_impl")
    import jax.numpy as jnp
    return jx.dsa_decode_step, lambda a: None if a is None else jnp.asarray(a)


def _call(step, conv, c, path, **kw):
    i, m = c.indexer, c.mla
    return step(conv(m.q), conv(m.kv_cache), conv(i.q), conv(i.weights), conv(i.k_cache),
                conv(i.block_table), conv(i.context_lens), m.sm_scale, TOPK, kv_format=m.kv_format,
                d_v=m.d_v, attn_sink=conv(m.attn_sink), path=path, **kw)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_step_window_argument_checked_first(backend):
    c = _case()
    step, conv = _step(backend)
    with pytest.raises(ValueError, match="window"):
        _call(step, conv, c, "auto", window=-1)
    with pytest.raises(TypeError, match="window"):
        _call(step, conv, c, "auto", window=True)
    with pytest.raises(TypeError, match="context_lens"):
        i = c.indexer
        m = c.mla
        step(conv(m.q), conv(m.kv_cache), conv(i.q), conv(i.weights), conv(i.k_cache),
             conv(i.block_table), conv(i.context_lens.astype(np.float32)), m.sm_scale, TOPK,
             kv_format=m.kv_format, d_v=m.d_v, window=WINDOW, path="auto")


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_step_refuses_caches_of_different_page_pools(backend):
    """One block table addresses both caches: a latent cache with fewer pages, or with another
    page size, than the indexer cache is refused (ValueError naming k_cache) before either op
    runs; it used to run and return attention over the wrong rows (newcomer trial 2026-12-02)."""
    c = _case()
    step, conv = _step(backend)
    m = c.mla
    kv = m.kv_cache
    fewer = kv[:-1]
    assert kv.shape[0] > 1
    for bad in (fewer,):
        with pytest.raises(ValueError, match="k_cache: expected the page pool of kv_cache"):
            i = c.indexer
            step(conv(m.q), conv(bad), conv(i.q), conv(i.weights), conv(i.k_cache),
                 conv(i.block_table), conv(i.context_lens), m.sm_scale, TOPK,
                 kv_format=m.kv_format, d_v=m.d_v, attn_sink=conv(m.attn_sink), path="auto")
    if m.kv_format != "fp8_model1":                 # [num_pages, P, D]: halve P, double pages
        other_p = kv.reshape(kv.shape[0] * 2, kv.shape[1] // 2, *kv.shape[2:])
        with pytest.raises(ValueError, match="page size"):
            i = c.indexer
            step(conv(m.q), conv(other_p), conv(i.q), conv(i.weights), conv(i.k_cache),
                 conv(i.block_table), conv(i.context_lens), m.sm_scale, TOPK,
                 kv_format=m.kv_format, d_v=m.d_v, attn_sink=conv(m.attn_sink), path="auto")


def _forbid(monkeypatch, module, *ops):
    """Replace ``module``'s ``ops`` by a function that fails the test if called: the step must
    refuse its arguments before any op runs."""
    def forbidden(*a, **k):
        raise AssertionError("an op ran before the step's arguments were checked")
    for op in ops:
        monkeypatch.setattr(module, op, forbidden)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_step_checks_the_attention_arguments_before_the_indexer(backend, monkeypatch):
    """A bad q, attn_sink or d_v is refused (named) before the indexer runs: the indexer is
    replaced by a function that fails the test if called (newcomer trial 2026-12-03: the error
    came after the whole indexer, 13-15 s late in JAX)."""
    c = _case()
    step, conv = _step(backend)
    mod = __import__("torch_impl.step" if backend == "torch" else "jax_impl.step", fromlist=["x"])
    _forbid(monkeypatch, mod, "indexer_topk")
    m, i = c.mla, c.indexer
    with pytest.raises(ValueError, match="q: expected rank 4|q: expected"):
        step(conv(m.q[0]), conv(m.kv_cache), conv(i.q), conv(i.weights), conv(i.k_cache),
             conv(i.block_table), conv(i.context_lens), m.sm_scale, TOPK, kv_format=m.kv_format,
             d_v=m.d_v, path="auto")
    with pytest.raises(ValueError, match="attn_sink: expected shape"):
        step(conv(m.q), conv(m.kv_cache), conv(i.q), conv(i.weights), conv(i.k_cache),
             conv(i.block_table), conv(i.context_lens), m.sm_scale, TOPK, kv_format=m.kv_format,
             d_v=m.d_v, attn_sink=conv(m.attn_sink[:3]), window=WINDOW, path="auto")
    with pytest.raises(ValueError, match="d_v"):
        step(conv(m.q), conv(m.kv_cache), conv(i.q), conv(i.weights), conv(i.k_cache),
             conv(i.block_table), conv(i.context_lens), m.sm_scale, TOPK, kv_format=m.kv_format,
             d_v=10_000, path="auto")


def _step_args(c, conv, **over):
    """The step's positional arguments by its own names, with ``over`` replacing some."""
    m, i = c.mla, c.indexer
    a = dict(q=m.q, kv_cache=m.kv_cache, idx_q=i.q, idx_weights=i.weights, k_cache=i.k_cache,
             block_table=i.block_table, context_lens=i.context_lens)
    a.update(over)
    names = ("q", "kv_cache", "idx_q", "idx_weights", "k_cache", "block_table", "context_lens")
    return [conv(a[n]) for n in names]


def _bad_step_inputs(c):
    """(what, argument overrides, exception, pattern): each names the step's own argument."""
    m, i = c.mla, c.indexer
    q2 = np.concatenate([m.q, m.q], axis=1)                    # N = 4 against idx_q's N = 2
    return [
        ("idx_q float32", dict(idx_q=i.q.astype(np.float32)), TypeError, r"^idx_q: expected dtype"),
        ("idx_q rank 3", dict(idx_q=i.q[0]), ValueError, r"^idx_q: expected rank 4"),
        ("idx_q None", dict(idx_q=None), TypeError, r"^idx_q: expected"),
        ("idx_weights float16", dict(idx_weights=i.weights.astype(np.float16)), TypeError,
         r"^idx_weights: expected dtype"),
        ("idx_weights wrong H_I", dict(idx_weights=i.weights[..., :3]), ValueError,
         r"^idx_weights: expected shape \(2, 2, 8\)"),
        ("q N 4, idx_q N 2", dict(q=q2), ValueError, r"^q, idx_q: expected the same B and N"),
        ("idx_q B 1", dict(idx_q=i.q[:1]), ValueError, r"^q, idx_q: expected the same B and N"),
        ("q B 1", dict(q=m.q[:1]), ValueError, r"^q, idx_q: expected the same B and N"),
    ]


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_step_errors_name_the_steps_own_arguments(backend, monkeypatch):
    """A bad ``idx_q`` / ``idx_weights``, or ``q`` and ``idx_q`` of different B or N, is refused
    under the step's own argument names (not the indexer's ``q`` / ``weights`` or the attention's
    ``indices``) before either op runs (newcomer trial 2026-12-05, D2): both ops are replaced by
    functions that fail the test if called."""
    c = _case()
    step, conv = _step(backend)
    mod = __import__("torch_impl.step" if backend == "torch" else "jax_impl.step", fromlist=["x"])
    _forbid(monkeypatch, mod, "indexer_topk", "sparse_mla_decode")
    m = c.mla
    for what, over, exc, pattern in _bad_step_inputs(c):
        with pytest.raises(exc, match=pattern):
            step(*_step_args(c, conv, **over), m.sm_scale, TOPK, kv_format=m.kv_format,
                 d_v=m.d_v, attn_sink=conv(m.attn_sink), path="auto")


def test_step_tp_errors_name_the_steps_own_arguments(monkeypatch):
    """torch ``dsa_decode_step_tp`` (replicated indexer: no process group needed to reach the
    checks) names its own arguments too, before either op runs; ``idx_q=None`` used to say
    ``q: expected a torch.Tensor, got NoneType`` (trial D2)."""
    ti = pytest.importorskip("torch_impl")
    from torch_impl import tp as ttp
    from torch_impl._common import as_tensor
    c = _case()
    _forbid(monkeypatch, ttp, "indexer_topk", "sparse_mla_decode")
    m = c.mla
    for what, over, exc, pattern in _bad_step_inputs(c):
        with pytest.raises(exc, match=pattern):
            ti.dsa_decode_step_tp(*_step_args(c, as_tensor, **over), m.sm_scale, TOPK,
                                  kv_format=m.kv_format, d_v=m.d_v,
                                  attn_sink=as_tensor(m.attn_sink), path="auto")
    with pytest.raises(TypeError, match=r"^idx_q: expected a torch.Tensor, got NoneType"):
        ti.dsa_decode_step_tp(as_tensor(m.q), None, None, None, None, None, None, 0.1, TOPK)
