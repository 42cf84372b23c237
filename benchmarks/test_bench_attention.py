"""Attention kernels over sequence length, MHA and GQA: the implementation's naive
``scaled_dot_product_attention`` (explicit scores and mask), its ``flash_attention``
(tiled online softmax), and PyTorch's ``F.scaled_dot_product_attention`` as the baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def qkv(sizes, heads: str, length: int, device: str):
    n_heads, n_kv_heads = sizes.attention_heads[heads]
    b, d = sizes.attention_batch, sizes.attention_d_head
    g = torch.Generator().manual_seed(length)
    make = lambda h: torch.randn(b, h, length, d, generator=g).to(device=device, dtype=sizes.dtype)
    return make(n_heads), make(n_kv_heads), make(n_kv_heads)


def test_attention(impl, measure, sizes, device, heads, attention_length, kernel):
    q, k, v = qkv(sizes, heads, attention_length, device)
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    if kernel == "naive":
        mask = torch.ones(attention_length, attention_length, dtype=torch.bool, device=device).tril()
        fn = lambda: impl.scaled_dot_product_attention(q, k, v, mask)
    elif kernel == "flash":
        fn = lambda: impl.flash_attention(q, k, v, causal=True, block_size=sizes.flash_block_size)
    else:
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_heads != n_kv_heads)
    out = measure(
        fn,
        group=f"attention {heads} T={attention_length:05d}",
        bench="attention",
        kernel=kernel,
        heads=heads,
        T=attention_length,
        batch=q.shape[0],
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_head=q.shape[-1],
        dtype=str(sizes.dtype).removeprefix("torch."),
        # causal attention: q k^T and p v over the lower triangle, 2 FLOPs per multiply-add
        flops=2 * 2 * q.shape[0] * n_heads * attention_length * (attention_length + 1) // 2 * q.shape[-1],
    )
    assert out.shape == q.shape, f"{kernel} attention returned {tuple(out.shape)}, expected {tuple(q.shape)}"
