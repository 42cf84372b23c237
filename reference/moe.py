"""Protocol v2 (capability ``moe``, amendment 28; Mixtral): the sparse mixture-of-experts MLP and its
load-balancing loss, as Hugging Face's ``MixtralSparseMoeBlock`` and ``load_balancing_loss_func``."""

from __future__ import annotations

import torch
from einops import reduce

from .mlp import swiglu
from .primitives import linear, softmax


def check_top_k(top_k, n_experts: int, where: str) -> None:
    """``top_k`` must be an int with ``1 <= top_k <= n_experts``."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
        raise ValueError(f"{where}: top_k must be an int in [1, n_experts={n_experts}], got {top_k!r}")


def router_probs(logits: torch.Tensor) -> torch.Tensor:
    """The routing distribution: softmax over the experts (last axis), in at least float32 as Mixtral's
    ``softmax(router_logits.float())``. ``[..., E] -> [..., E]``."""
    return softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def routing_weights(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[..., E]`` gates: the ``top_k`` largest probabilities of each token renormalised to sum 1, 0 elsewhere
    (ties broken as ``torch.topk``)."""
    top, chosen = torch.topk(probs, top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, chosen, top)


def moe_mlp(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    top_k: int,
) -> torch.Tensor:
    """Mixtral's sparse MoE MLP: ``sum_{e in top-k} g_e * swiglu(x, w_gate[e], w_up[e], w_down[e])``.

    x: ``[..., d]``; router: ``[E, d]``; w_gate, w_up: ``[E, f, d]``; w_down: ``[E, d, f]``. Returns ``[..., d]``.
    The router logits ``x @ router.T [..., E]`` go through a softmax over the experts (at least float32); each
    token keeps its ``top_k`` most probable experts, their probabilities renormalised to sum 1 (``g``). An expert
    no token chooses is not computed (its weights get no gradient).
    """
    n_experts = router.shape[0]
    check_top_k(top_k, n_experts, "moe_mlp")
    if w_gate.shape[0] != n_experts or w_up.shape[0] != n_experts or w_down.shape[0] != n_experts:
        raise ValueError(
            f"moe_mlp: router has {n_experts} experts but w_gate, w_up, w_down have "
            f"{w_gate.shape[0]}, {w_up.shape[0]}, {w_down.shape[0]}"
        )
    gates = routing_weights(router_probs(linear(x, router)), top_k)  # [..., E]
    out = torch.zeros_like(x)
    for e in range(n_experts):
        gate = gates[..., e : e + 1]  # [..., 1]
        chosen = gate != 0
        if not chosen.any():
            continue
        out = out + torch.where(chosen, gate * swiglu(x, w_gate[e], w_up[e], w_down[e]), 0.0).to(x.dtype)
    return out


def moe_load_balancing_loss(router_logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """One layer's auxiliary load-balancing loss (Switch Transformer; Hugging Face's ``load_balancing_loss_func``):
    ``E * sum_e f_e * P_e``, a scalar.

    router_logits: ``[N, E]`` (one row per token). ``P_e``: the mean over tokens of the softmax probability of
    expert ``e`` (at least float32); ``f_e``: the number of tokens that choose ``e`` among their ``top_k``, over
    ``N`` (so ``sum_e f_e = top_k``). A uniform router gives ``top_k``.
    """
    if router_logits.dim() != 2:
        raise ValueError(f"moe_load_balancing_loss: router_logits must be [N, E], got {tuple(router_logits.shape)}")
    n_tokens, n_experts = router_logits.shape
    check_top_k(top_k, n_experts, "moe_load_balancing_loss")
    probs = router_probs(router_logits)  # [N, E]
    _, chosen = torch.topk(probs, top_k, dim=-1)  # [N, k]
    picked = torch.zeros_like(probs).scatter(-1, chosen, 1.0)  # [N, E], 1 where the token chose the expert
    fraction = reduce(picked, "n e -> e", "sum") / n_tokens
    prob = reduce(probs, "n e -> e", "mean")
    return n_experts * (fraction * prob).sum()
