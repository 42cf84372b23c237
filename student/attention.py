"""Causal self-attention: the causal mask, grouped-query head sharing, and attention itself.

Per-head tensors are ``[B, H, T, d_head]`` with ``d_head = d_model // n_heads``.
Projection rows are head-major: rows ``h*d_head:(h+1)*d_head`` of ``wq`` belong to head ``h``.

Grouped-query attention (GQA): there are ``n_kv_heads <= n_heads`` key/value heads and
``n_rep = n_heads // n_kv_heads`` query heads share each one. Query head ``h`` reads key/value
head ``h // n_rep`` -- ``repeat_interleave`` semantics, as in
``F.scaled_dot_product_attention(..., enable_gqa=True)``. ``n_kv_heads == n_heads`` is ordinary
multi-head attention; ``n_kv_heads == 1`` is multi-query attention.

Boolean masks: ``True`` = may attend.
"""

from __future__ import annotations

import torch


def causal_mask(
    t_q: int, t_k: int, device: torch.device | str | None = None, *, window: int | None = None
) -> torch.Tensor:
    """Bool causal mask ``[t_q, t_k]``, ``True`` = may attend, bottom-right aligned.

    Query ``i`` (of ``t_q``) may attend key ``j`` (of ``t_k``) iff ``j <= i + (t_k - t_q)``.
    Why bottom-right: with a KV cache the ``t_q`` new queries are the *last* ``t_q`` of the
    ``t_k`` positions, so the last query is the newest token and sees every key. With
    ``t_q == t_k`` this is the ordinary lower triangle (diagonal included). Created on ``device``.

    Example, ``t_q=2, t_k=4``::

        [[True, True, True, False],
         [True, True, True, True ]]

    Classic bugs to avoid:
    - top-left alignment (``torch.tril(ones(t_q, t_k))``, or PyTorch's ``is_causal=True``)
      is only right when ``t_q == t_k``; a single cached-decoding query would see one key;
    - an inverted mask: here True means *allowed*; masked_fill the positions where it is False.

    Optional, protocol v2 (docs/protocol.md, amendment 27; Mistral-style sliding windows): a keyword-only
    ``window=None``. With ``window = W`` query ``i`` also needs ``i + (t_k - t_q) - j < W``: it sees the last
    ``W`` keys up to itself, *itself included* (``W = 1`` sees only itself). With ``t_q=2, t_k=4, window=2``::

        [[False, True, True, False],
         [False, False, True, True ]]

    Classic bugs: ``<= W`` (W + 1 keys); measuring the distance from ``i`` (the query's row) instead of its
    position ``i + (t_k - t_q)`` after the cached keys (right only when ``t_q == t_k``).
    The skeleton declares ``"sliding_window"`` in ``CAPABILITIES`` (``__init__.py``); remove it to skip these tests.
    """
    raise NotImplementedError("causal_mask")


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand key/value heads for GQA: ``[B, Hkv, T, d] -> [B, Hkv * n_rep, T, d]``.

    Output head ``h`` is input head ``h // n_rep``: heads come out ``[0, 0, 1, 1, ...]`` for
    ``n_rep = 2``. Leading axes before the head axis (``x.shape[:-3]``) may be anything.
    ``n_rep == 1`` returns the same values. ``n_rep < 1`` -> ``ValueError``.

    Classic bug to avoid: GQA uses repeat_interleave, not tile -- ``x.repeat(1, n_rep, 1, 1)``
    gives ``[0, 1, 0, 1, ...]`` and pairs query heads with the wrong key/value heads (it still
    runs, and is still wrong).
    """
    raise NotImplementedError("repeat_kv")


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *, softcap: float | None = None
) -> torch.Tensor:
    """Attention: ``softmax(q @ k^T / sqrt(d_head), masked, over the key axis) @ v``.

    Shapes::

        q:      [..., Hq, Tq, d]      usually [B, Hq, Tq, d_head]
        k, v:   [..., Hkv, Tk, d]     Hq must be a multiple of Hkv (GQA; see repeat_kv)
        mask:   bool, broadcastable to [..., Hq, Tq, Tk]   (True = may attend), or None
        return: [..., Hq, Tq, d]

    Steps: expand k/v heads to Hq (query head h uses kv head h // (Hq // Hkv)); scores
    ``[..., Hq, Tq, Tk]``; set disallowed scores to ``-inf``; softmax over keys; weight ``v``.
    Hq not a multiple of Hkv -> ``ValueError`` naming both. Rows with no allowed key are
    unspecified.

    Classic bugs to avoid:
    - softmax over the key axis (dim=-1), not the query axis (dim=-2);
    - divide by sqrt(d_head) (= ``q.shape[-1]``), not sqrt(d_model) -- unscaled scores saturate
      the softmax and learning stalls;
    - mask with ``-inf`` *before* the softmax (zeroing probabilities afterwards leaves rows that
      no longer sum to 1), and get the mask broadcast shape right (``[Tq, Tk]`` broadcasts over
      batch and heads; a ``[Tk, Tq]`` mask only "works" when Tq == Tk);
    - ``k.transpose(-2, -1)``, not ``k.T`` (which reverses every axis of a 4-D tensor).

    Optional, protocol v2 (amendment 25, capability ``logit_softcap``; Gemma 2): keyword-only ``softcap=None``.
    With ``softcap = c`` the scaled scores become ``c * tanh(scores / c)`` *before* the mask: capping after the
    ``-inf`` fill turns masked scores into ``-c`` and gives future keys weight. Classic bugs: ``c * tanh(scores)``
    (no division), capping ``q @ k^T`` before dividing by sqrt(d_head). The skeleton declares
    ``"logit_softcap"`` in ``CAPABILITIES`` (``__init__.py``); remove it to skip these tests.
    """
    raise NotImplementedError("scaled_dot_product_attention")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_size: int = 64
) -> torch.Tensor:
    """Tiled attention with an online softmax, in plain torch: FlashAttention's algorithm.

    Shapes as ``scaled_dot_product_attention`` (GQA included). ``causal`` applies the
    bottom-right aligned causal mask. The result must equal
    ``scaled_dot_product_attention(q, k, v, causal_mask(Tq, Tk) if causal else None)`` to
    rounding, for ANY ``block_size >= 1`` (including ones that do not divide Tq or Tk, and ones
    larger than T). ``block_size < 1`` -> ``ValueError``. It is exact, not an approximation.

    Algorithm: for each block of ``block_size`` queries keep, per query row, a running max
    ``m`` (start ``-inf``), a running normaliser ``l`` (start 0) and an unnormalised output
    ``acc [.., block, d]`` (start 0). For each block of keys/values:
    ``s = q_blk @ k_blk^T / sqrt(d)`` (masked), ``m_new = max(m, rowmax(s))``,
    ``p = exp(s - m_new)``, ``c = exp(m - m_new)``, ``l = l*c + rowsum(p)``,
    ``acc = acc*c + p @ v_blk``, ``m = m_new``. Finally the block's output is ``acc / l``.
    Never form the full ``[Tq, Tk]`` score matrix. With ``causal``, key blocks entirely in the
    future of a query block can be skipped.

    Classic bugs to avoid:
    - forgetting to rescale ``acc`` (not just ``l``) by ``exp(m_old - m_new)``;
    - a row whose keys in this block are all masked has ``m_new = -inf`` and
      ``-inf - (-inf) = NaN``: shift by 0 (or skip) where the max is still ``-inf``;
    - off-by-one at the last, shorter block.
    """
    raise NotImplementedError("flash_attention")


def multihead_self_attention(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    wo: torch.Tensor,
    n_heads: int,
    n_kv_heads: int | None = None,
    theta: float | None = None,
    positions: torch.Tensor | None = None,
    *,
    window: int | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-5,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal (multi-head / grouped-query) self-attention of a sequence, no biases.

    Shapes::

        x:         [B, T, d_model]
        wq:        [n_heads * d_head, d_model]
        wk, wv:    [n_kv_heads * d_head, d_model]     n_kv_heads defaults to n_heads
        wo:        [d_model, n_heads * d_head]
        positions: long [T] or [B, T]; default arange(T)   (used only with RoPE)
        return:    [B, T, d_model]

    Steps: project (``linear``); split heads ``[B, T, H*d_head] -> [B, H, T, d_head]``
    (reshape to ``[B, T, H, d_head]``, then transpose(1, 2)); if ``theta`` is not None apply
    ``rope`` to q and k at ``positions``; causal attention (``causal_mask(T, T)``, GQA for
    ``n_kv_heads < n_heads``); merge heads back to ``[B, T, H*d_head]``; project with ``wo``.
    ``n_heads`` not dividing ``wq``'s rows, or ``n_kv_heads`` not dividing ``n_heads`` ->
    ``ValueError`` naming the values.

    Classic bugs to avoid:
    - merge heads with transpose before reshape: ``out.transpose(1, 2).reshape(B, T, H*d_head)``;
      reshaping ``[B, H, T, d]`` straight to ``[B, T, H*d]`` scrambles tokens and heads;
    - splitting heads with ``view(B, H, T, d)`` directly (same scramble, in the other direction);
    - RoPE on q and k, never v;
    - ``[B, T]`` positions must broadcast over the head axis (``[B, 1, T]``);
    - without ``theta`` (GPT-2 style, no RoPE) the mask is still causal, and float64 stays float64:
      the suite judges that path on its own (amendment 21).

    Optional, protocol v2 (amendment 27, capability ``sliding_window``): keyword-only ``window=None``; with
    ``window = W`` each query attends only the last ``W`` keys up to itself (``causal_mask(T, T, window=W)``).

    Optional, protocol v2 (amendment 24, capability ``qk_norm``; Qwen3-style): keyword-only ``q_norm=None,
    k_norm=None`` (each ``[d_head]``) and ``norm_eps=1e-5``. Right after splitting heads, before RoPE::

        q = rmsnorm(q, q_norm, norm_eps)    # q: [B, H, T, d_head]: the statistic of each head's d_head
        k = rmsnorm(k, k_norm, norm_eps)    # k: [B, Hkv, T, d_head]; v stays as projected

    One gain shared by every head. Classic bugs: normalising ``[B, T, H*d_head]`` before the split (one
    statistic over all heads: OLMo 2's norm, not this one); normalising after RoPE (RoPE keeps the norm, so
    this shows only through the gains); normalising v too; using ``q_norm``'s weight for the keys.
    The skeleton declares ``"qk_norm"`` in ``CAPABILITIES`` (``__init__.py``); remove it to skip these tests.

    Optional, protocol v2 (amendment 25, capability ``logit_softcap``): keyword-only ``softcap=None``, passed to
    ``scaled_dot_product_attention(..., softcap=)``: every head's scaled scores capped before the causal mask, on
    the cached path too.
    """
    raise NotImplementedError("multihead_self_attention")
