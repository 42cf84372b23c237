"""Hypothesis strategies shared by the property tests. Tensors are built from drawn integer
seeds (never drawn element by element), so examples are cheap, reproducible and shrink well."""

from __future__ import annotations

from hypothesis import strategies as st

seeds = st.integers(min_value=0, max_value=2**31 - 1)


@st.composite
def attention_shapes(draw, max_t: int = 12):
    """``(B, H, H_kv, T_q, T_k, d_head)`` with ``H % H_kv == 0`` and ``T_q <= T_k``."""
    h_kv = draw(st.integers(1, 3))
    n_rep = draw(st.integers(1, 3))
    t_k = draw(st.integers(1, max_t))
    t_q = draw(st.integers(1, t_k))
    return (draw(st.integers(1, 3)), h_kv * n_rep, h_kv, t_q, t_k, 2 * draw(st.integers(1, 6)))


@st.composite
def chunkings(draw, total: int, max_chunks: int = 6):
    """A split of ``total`` tokens into consecutive chunk lengths (>= 1 each), e.g. [5, 1, 1, 6]."""
    n_cuts = draw(st.integers(0, min(max_chunks - 1, total - 1)))
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), min_size=n_cuts, max_size=n_cuts))) if n_cuts else []
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]
