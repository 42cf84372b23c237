"""The course's function table, filled in as students do: glue only, the logic lives in cs336_basics."""

from __future__ import annotations

import torch
from cs336_basics.model import (
    Embedding,
    Linear,
    MultiHeadSelfAttention,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    TransformerLM,
    scaled_dot_product_attention,
    silu,
    softmax,
)
from cs336_basics.nn_utils import cross_entropy, get_batch
from torch import Tensor


def run_linear(d_in: int, d_out: int, weights: Tensor, in_features: Tensor) -> Tensor:
    layer = Linear(d_in, d_out, device=weights.device, dtype=weights.dtype)
    layer.load_state_dict({"weight": weights})
    return layer(in_features)


def run_embedding(vocab_size: int, d_model: int, weights: Tensor, token_ids: Tensor) -> Tensor:
    layer = Embedding(vocab_size, d_model, device=weights.device, dtype=weights.dtype)
    layer.load_state_dict({"weight": weights})
    return layer(token_ids)


def run_swiglu(d_model, d_ff, w1_weight, w2_weight, w3_weight, in_features):
    ffn = SwiGLU(d_model, d_ff, device=w1_weight.device, dtype=w1_weight.dtype)
    ffn.load_state_dict({"w1.weight": w1_weight, "w2.weight": w2_weight, "w3.weight": w3_weight})
    return ffn(in_features)


def run_scaled_dot_product_attention(Q, K, V, mask=None):
    return scaled_dot_product_attention(Q, K, V, mask)


def _mha(d_model, num_heads, rope, q, k, v, o):
    mha = MultiHeadSelfAttention(d_model, num_heads, rope, device=q.device, dtype=q.dtype)
    mha.load_state_dict(
        {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v, "output_proj.weight": o}, strict=False
    )
    return mha


def run_multihead_self_attention(
    d_model, num_heads, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight, in_features
):
    return _mha(d_model, num_heads, None, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight)(in_features)


def run_multihead_self_attention_with_rope(
    d_model,
    num_heads,
    max_seq_len,
    theta,
    q_proj_weight,
    k_proj_weight,
    v_proj_weight,
    o_proj_weight,
    in_features,
    token_positions=None,
):
    rope = RotaryPositionalEmbedding(theta, d_model // num_heads, max_seq_len, device=in_features.device)
    mha = _mha(d_model, num_heads, rope, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight)
    return mha(in_features, token_positions)


def run_rope(d_k, theta, max_seq_len, in_query_or_key, token_positions):
    return RotaryPositionalEmbedding(theta, d_k, max_seq_len, device=in_query_or_key.device)(
        in_query_or_key, token_positions
    )


def run_transformer_lm(
    vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, weights, in_indices
):
    some = weights["token_embeddings.weight"]
    model = TransformerLM(
        vocab_size,
        context_length,
        d_model,
        num_layers,
        num_heads,
        d_ff,
        rope_theta,
        device=some.device,
        dtype=some.dtype,
    )
    model.load_state_dict(weights, strict=False)
    return model(in_indices)


def run_rmsnorm(d_model: int, eps: float, weights: Tensor, in_features: Tensor) -> Tensor:
    norm = RMSNorm(d_model, eps, device=weights.device, dtype=weights.dtype)
    norm.load_state_dict({"weight": weights})
    return norm(in_features)


def run_silu(in_features: Tensor) -> Tensor:
    return silu(in_features)


def run_get_batch(dataset, batch_size: int, context_length: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    return get_batch(dataset, batch_size, context_length, device)


def run_softmax(in_features: Tensor, dim: int) -> Tensor:
    return softmax(in_features, dim)


def run_cross_entropy(inputs: Tensor, targets: Tensor) -> Tensor:
    return cross_entropy(inputs, targets)


def run_gradient_clipping(parameters, max_l2_norm: float) -> None:
    raise NotImplementedError


def get_adamw_cls():
    raise NotImplementedError


def run_get_lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters):
    raise NotImplementedError
