"""Inputs the attention tests share: per-head q/k/v, the causal mask written out, the key/value head count
an implementation supports, and multi-head attention weights (shapes as in ``docs/protocol.md``)."""

import torch

from . import round_trip
from .inputs import S


def qkv(spec, b, h, h_kv, t_q, t_k, d, *, seed, dtype=torch.float64):
    """q ``[b, h, t_q, d]``, k and v ``[b, h_kv, t_k, d]``, unit scale, each row different."""
    q = spec.inputs.per_head(b, h, t_q, d, seed=seed, dtype=dtype)
    k = spec.inputs.per_head(b, h_kv, t_k, d, seed=seed + 1, dtype=dtype)
    v = spec.inputs.per_head(b, h_kv, t_k, d, seed=seed + 2, dtype=dtype)
    return q, k, v


def bottom_right(t_q: int, t_k: int, device) -> torch.Tensor:
    """The protocol's causal mask, written out: query i sees key j iff j <= i + (t_k - t_q)."""
    return (torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)).to(device)


def kv_heads(spec, grouped: int = S.H_KV) -> int:
    """``grouped`` key/value heads when the implementation supports GQA, else one per query head."""
    return grouped if "gqa" in spec.impl.capabilities else S.H


def mha_weights(spec, h, h_kv, *, seed, dtype=torch.float64):
    """``(w_q [h * D_HEAD, d_model], w_k [h_kv * D_HEAD, d_model], w_v [h_kv * D_HEAD, d_model],
    w_o [d_model, h * D_HEAD])``, fan-in scaled."""
    d, dh = S.d_model, S.D_HEAD
    return (
        spec.inputs.fan_in_weight(h * dh, d, seed=seed, dtype=dtype),
        spec.inputs.fan_in_weight(h_kv * dh, d, seed=seed + 1, dtype=dtype),
        spec.inputs.fan_in_weight(h_kv * dh, d, seed=seed + 2, dtype=dtype),
        spec.inputs.fan_in_weight(d, h * dh, seed=seed + 3, dtype=dtype),
    )


def loaded_alike(spec, x, weights, h: int, h_kv: int, norms=None, **kw) -> tuple[tuple[str, ...], object]:
    """``rebase`` for multihead_self_attention (``round_trip.rebase``): the reference's attention on the weights as
    the implementation's own round trip gives them back (``norms``: ``q_norm`` and ``k_norm``, in a qk_norm model)."""
    names = ["attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight"]
    given = dict(zip(names, weights, strict=True))
    changes = {"d_model": x.shape[-1], "n_heads": h, "n_kv_heads": h_kv}
    if norms is not None:
        given.update(zip(("attn.q_norm.weight", "attn.k_norm.weight"), norms, strict=True))
        changes.update(qk_norm=True, norm_eps=kw.get("norm_eps", 1e-5))

    def compute(ref, back):
        more = {} if norms is None else {"q_norm": back["attn.q_norm.weight"], "k_norm": back["attn.k_norm.weight"]}
        return ref.multihead_self_attention(x.to(torch.float64), *(back[n] for n in names), h, h_kv, **kw, **more)

    return round_trip.rebase(spec, "llama", changes, given, compute, x)
