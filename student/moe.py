"""Protocol v2, capability ``moe`` (amendment 28; Mixtral): the sparse mixture-of-experts MLP and its
load-balancing loss. Optional: remove ``"moe"`` from ``CAPABILITIES`` (``__init__.py``) to skip these tests."""

from __future__ import annotations

import torch


def moe_mlp(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    top_k: int,
) -> torch.Tensor:
    """Mixtral's sparse MoE MLP: each token goes through its ``top_k`` experts (each a SwiGLU), mixed by weights.

    Shapes::

        x:            [..., d]
        router:       [E, d]          (E experts)
        w_gate, w_up: [E, f, d]       (expert e's SwiGLU weights are w_gate[e], w_up[e], w_down[e])
        w_down:       [E, d, f]
        return:       [..., d]

    Per token: ``probs = softmax(x @ router.T)`` over the E experts (in at least float32); keep the ``top_k``
    largest (``torch.topk``), renormalise those to sum 1 (``g``); the output is ``sum_e g_e * swiglu(x, w_gate[e],
    w_up[e], w_down[e])`` over the chosen experts. ``top_k`` outside ``[1, E]`` -> ``ValueError`` naming it.

    Classic bugs to avoid: the softmax over the tokens instead of the experts; forgetting to renormalise the
    chosen weights; mixing up which expert index belongs to which weights.
    """
    raise NotImplementedError("moe_mlp")


def moe_load_balancing_loss(router_logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """One layer's auxiliary load-balancing loss (Switch Transformer, as Hugging Face's Mixtral): a scalar.

    Shapes::

        router_logits: [N, E]   (one row per token)
        return:        []

    ``probs = softmax(router_logits)`` over the experts; ``P_e`` = mean over tokens of ``probs[:, e]``; ``f_e`` =
    (number of tokens whose ``top_k`` experts include ``e``) / N. The loss is ``E * sum_e f_e * P_e`` (a uniform
    router gives ``top_k``). ``top_k`` outside ``[1, E]`` -> ``ValueError`` naming it.
    """
    raise NotImplementedError("moe_load_balancing_loss")
