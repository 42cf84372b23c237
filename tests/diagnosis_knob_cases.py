"""The knob-search cases: protocol calls on suite-shaped inputs, their specified outputs (computed with
torch.nn.functional or plain formulas) and, per call, bugs written the same way with the code that names
each. Used by tests/test_diagnosis_knobs.py and tests/test_diagnosis_ranking.py."""

import math

import torch
import torch.nn.functional as F
from diagnosis_cases import (
    D_FF,
    D_MODEL,
    EXACT,
    F32_ATTENTION,
    F32_MATMUL,
    H_KV,
    B,
    D,
    H,
    T,
    V,
    batch_logits,
    causal,
    ids,
    qkv,
    randn,
    rope_complex,
    sampling_probs,
    sdpa,
    uniform,
)

from spec_tests.harness.diagnosis import knob_causes
from spec_tests.harness.diagnosis.codes import is_valid

POS = torch.arange(5, 5 + T)


class Case:
    """A protocol call: its arguments, the specified output (independently computed) and bugs."""

    def __init__(self, name, args, kwargs, correct, bugs, tol=EXACT, other=None, style="interleaved"):
        self.name, self.args, self.kwargs, self.correct = name, args, kwargs, correct
        self.bugs, self.tol, self.style = bugs, tol, style
        self.other = other if other is not None else (lambda out: out * 1.01)  # a bug outside the family

    def diagnose(self, actual):
        causes = knob_causes(self.name, self.args, self.kwargs, actual, rope_style=self.style, **self.tol)
        assert all(is_valid(c.code) and c.source == "knob" for c in causes)
        return causes


def alibi_bias(n_heads: int, t: int) -> torch.Tensor:
    """ALiBi's additive bias [n_heads, t, t] for a power-of-two head count: -2^(-8 h / n) * (i - j)."""
    assert n_heads & (n_heads - 1) == 0
    slopes = torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)], dtype=torch.float64)
    distance = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).to(torch.float64)
    return -slopes[:, None, None] * distance


def rms(x, w, eps=1e-5, dim=-1, unbiased=False, weight=True):
    n = x.shape[dim]
    ms = x.pow(2).sum(dim, keepdim=True) / (n - 1 if unbiased else n)
    y = x / torch.sqrt(ms + eps)
    return y * w if weight else y


def cases():
    out = []
    # norms: small inputs (mean(x**2) ~ eps) make eps visible
    x = randn(B, T, D_MODEL, seed=11, scale=3e-3)
    w = uniform(D_MODEL, low=0.5, high=1.5, seed=12)
    out.append(
        Case(
            "rmsnorm",
            (x, w),
            {},
            F.rms_norm(x, (D_MODEL,), w, 1e-5),
            {
                "eps_outside": (lambda: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5) * w, "knob:eps_placement"),
                "unbiased": (lambda: rms(x, w, unbiased=True), "knob:variance_bias"),
                "mean_subtracted": (lambda: F.layer_norm(x, (D_MODEL,), w, None, 1e-5), "knob:mean_subtraction"),
                "variance_denominator": (  # Keras 3.0's rms_scaling: x over the root of its variance, uncentred
                    lambda: x / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * w,
                    "knob:mean_subtraction",
                ),
                "no_weight": (lambda: F.rms_norm(x, (D_MODEL,), None, 1e-5), "knob:norm_weight"),
                "weight_twice": (lambda: F.rms_norm(x, (D_MODEL,), w, 1e-5) * w, "knob:norm_weight"),
                "dim_1": (lambda: rms(x, w, dim=1), "knob:reduction_dim"),
            },
        )
    )
    out.append(
        Case(
            "rmsnorm",
            (x, w),
            {"eps": 1e-3},
            F.rms_norm(x, (D_MODEL,), w, 1e-3),
            {"eps_ignored": (lambda: F.rms_norm(x, (D_MODEL,), w, 1e-5), "knob:eps_value")},
        )
    )
    xf, wf = x.float(), w.float()
    out.append(
        Case(
            "rmsnorm",
            (xf, wf),
            {},
            F.rms_norm(x, (D_MODEL,), w, 1e-5),
            {
                "eps_outside_f32": (
                    lambda: xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5) * wf,
                    "knob:eps_placement",
                )
            },
            tol=F32_MATMUL,
        )
    )
    xl = randn(B, T, D_MODEL, seed=13, scale=3e-3) + 6e-3
    bl = randn(D_MODEL, seed=15)
    mu, var = xl.mean(-1, keepdim=True), xl.var(-1, unbiased=False, keepdim=True)
    out.append(
        Case(
            "layernorm",
            (xl, w, bl),
            {"eps": 1e-3},
            F.layer_norm(xl, (D_MODEL,), w, bl, 1e-3),
            {"eps_ignored": (lambda: F.layer_norm(xl, (D_MODEL,), w, bl, 1e-5), "knob:eps_value")},
            other=lambda out: out + 0.01,
        )
    )
    out.append(
        Case(
            "layernorm",
            (xl, w, bl),
            {},
            F.layer_norm(xl, (D_MODEL,), w, bl, 1e-5),
            {
                "eps_outside": (lambda: (xl - mu) / (var.sqrt() + 1e-5) * w + bl, "knob:eps_placement"),
                "unbiased": (
                    lambda: (xl - mu) / (xl.var(-1, keepdim=True) + 1e-5).sqrt() * w + bl,
                    "knob:variance_bias",
                ),
                "not_centred": (lambda: F.rms_norm(xl, (D_MODEL,), w, 1e-5) + bl, "knob:mean_subtraction"),
                "weight_bias_swapped": (lambda: F.layer_norm(xl, (D_MODEL,), bl, w, 1e-5), "knob:norm_weight"),
                "no_bias": (lambda: F.layer_norm(xl, (D_MODEL,), w, None, 1e-5), "knob:bias"),
            },
        )
    )
    # primitives
    xs = randn(B, T, V, seed=6, scale=3.0)
    out.append(
        Case(
            "softmax",
            (xs,),
            {"dim": 1},
            torch.softmax(xs, 1),
            {"last_dim": (lambda: torch.softmax(xs, -1), "knob:reduction_dim")},
        )
    )
    big = randn(B, V, seed=7) * 1e4
    out.append(
        Case(
            "softmax",
            (big,),
            {"dim": -1},
            torch.softmax(big, -1),
            {"naive": (lambda: big.exp() / big.exp().sum(-1, keepdim=True), "knob:max_subtraction")},
            other=lambda out: out.roll(1, -1),
        )
    )
    xw = randn(B, T, D_MODEL, seed=1)
    ws = randn(D_MODEL, D_MODEL, seed=2)
    bs = randn(D_MODEL, seed=3)
    out.append(
        Case(
            "linear",
            (xw, ws, bs),
            {},
            F.linear(xw, ws, bs),
            {
                "not_transposed": (lambda: xw @ ws + bs, "knob:weight_layout"),
                "no_bias": (lambda: xw @ ws.T, "knob:bias"),
            },
        )
    )
    xsi = randn(B, T, D_FF, seed=8, scale=4.0)
    out.append(Case("silu", (xsi,), {}, F.silu(xsi), {"sigmoid": (lambda: torch.sigmoid(xsi), "knob:activation")}))
    # mlp
    xm = randn(B, T, D_MODEL, seed=21)
    wg, wu = randn(D_FF, D_MODEL, seed=22) / math.sqrt(D_MODEL), randn(D_FF, D_MODEL, seed=23) / math.sqrt(D_MODEL)
    wd = randn(D_MODEL, D_FF, seed=24) / math.sqrt(D_FF)
    out.append(
        Case(
            "swiglu",
            (xm, wg, wu, wd),
            {},
            F.linear(F.silu(F.linear(xm, wg)) * F.linear(xm, wu), wd),
            {
                "silu_on_up": (lambda: F.linear(F.linear(xm, wg) * F.silu(F.linear(xm, wu)), wd), "knob:activation"),
                "gate_up_swapped": (
                    lambda: F.linear(F.silu(F.linear(xm, wu)) * F.linear(xm, wg), wd),
                    "knob:activation",
                ),
                "silu_of_the_product": (  # held out: w2(silu(w1(x) * w3(x))) in a gpt-fast-style FeedForward
                    lambda: F.linear(F.silu(F.linear(xm, wg) * F.linear(xm, wu)), wd),
                    "knob:activation",
                ),
            },
        )
    )
    wfc, bfc = randn(D_FF, D_MODEL, seed=26) * 2 / math.sqrt(D_MODEL), randn(D_FF, seed=27)
    wpr, bpr = randn(D_MODEL, D_FF, seed=28) / math.sqrt(D_FF), randn(D_MODEL, seed=29)
    out.append(
        Case(
            "gelu_mlp",
            (xm, wfc, bfc, wpr, bpr),
            {},
            F.linear(F.gelu(F.linear(xm, wfc, bfc), approximate="tanh"), wpr, bpr),
            {"exact_gelu": (lambda: F.linear(F.gelu(F.linear(xm, wfc, bfc)), wpr, bpr), "knob:activation")},
        )
    )
    # positions
    xr = randn(B, H, T, D, seed=41)
    d_model_freqs = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D_MODEL)
    i_freqs = 10000.0 ** (-torch.arange(0, D // 2, dtype=torch.float64) / D)

    def rope_with(freqs, x=xr, pos=POS):
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2).contiguous())
        angle = pos[:, None].double() * freqs
        z = z * torch.polar(torch.ones_like(angle), angle)
        return torch.view_as_real(z).reshape(x.shape)

    out.append(
        Case(
            "rope",
            (xr, POS),
            {},
            rope_complex(xr, POS),
            {
                "half_style": (lambda: rope_complex(xr, POS, style="half"), "knob:rope_style"),
                "wrong_direction": (lambda: rope_complex(xr, -POS), "sign"),
                "d_model_base": (lambda: rope_with(d_model_freqs), "knob:rope_base"),
                "i_not_2i": (lambda: rope_with(i_freqs), "knob:rope_base"),
                "offset_plus_1": (lambda: rope_complex(xr, POS + 1), "knob:position_offset"),
                "restart_at_0": (lambda: rope_complex(xr, torch.arange(T)), "knob:position_offset"),
            },
        )
    )
    out.append(
        Case(
            "rope",
            (xr, POS),
            {"theta": 500.0},
            rope_complex(xr, POS, theta=500.0),
            {"theta_ignored": (lambda: rope_complex(xr, POS), "knob:rope_theta")},
        )
    )
    out.append(
        Case(
            "rope",
            (xr, POS),
            {},
            rope_complex(xr, POS, style="half"),
            {"interleaved_style": (lambda: rope_complex(xr, POS, style="interleaved"), "knob:rope_style")},
            style="half",
        )
    )
    n, d = 37, D_MODEL
    p = torch.arange(n, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d, 2, dtype=torch.float64)
    ang = p / 10000.0 ** (two_i / d)
    table = torch.stack((ang.sin(), ang.cos()), -1).reshape(n, d)
    ang_j = p / 10000.0 ** (torch.arange(d, dtype=torch.float64) / d)
    out.append(
        Case(
            "sinusoidal_positions",
            (n, d),
            {},
            table,
            {
                "halves": (lambda: torch.cat((ang.sin(), ang.cos()), -1), "knob:sinusoid_layout"),
                "sin_cos_swapped": (
                    lambda: torch.stack((ang.cos(), ang.sin()), -1).reshape(n, d),
                    "knob:sinusoid_layout",
                ),
                "channel_index_exponent": (
                    lambda: torch.where(torch.arange(d) % 2 == 0, ang_j.sin(), ang_j.cos()),
                    "knob:rope_base",
                ),
            },
        )
    )
    # masks and attention
    t_q = 4
    out.append(
        Case(
            "causal_mask",
            (t_q, T),
            {},
            causal(t_q, T),
            {
                "top_left": (lambda: torch.ones(t_q, T, dtype=torch.bool).tril(), "knob:mask_alignment"),
                "diagonal_excluded": (lambda: causal(t_q, T, diagonal_shift=-1), "knob:mask_alignment"),
                "one_ahead": (lambda: causal(t_q, T, diagonal_shift=1), "knob:mask_alignment"),
                "inverted": (lambda: ~causal(t_q, T), "knob:mask_polarity"),
                "additive_inverted": (
                    lambda: torch.zeros(t_q, T).masked_fill(causal(t_q, T), float("-inf")),
                    "knob:mask_polarity",
                ),
            },
            other=lambda out: torch.rand(out.shape, generator=torch.Generator().manual_seed(0)) > 0.5,
        )
    )
    xk = randn(B, H_KV, T, D, seed=51)
    out.append(
        Case(
            "repeat_kv",
            (xk, H // H_KV),
            {},
            xk.repeat_interleave(H // H_KV, dim=1),
            {"tiled": (lambda: xk.repeat(1, H // H_KV, 1, 1), "knob:gqa_mapping")},
        )
    )
    q, k, v = qkv()
    m = causal(T, T)
    out.append(
        Case(
            "scaled_dot_product_attention",
            (q, k, v, m),
            {},
            sdpa(q, k, v, m),
            {
                "no_scale": (lambda: sdpa(q, k, v, m, scale=1.0), "knob:scale_constant"),
                "sqrt_d_model": (lambda: sdpa(q, k, v, m, scale=1 / math.sqrt(D_MODEL)), "knob:scale_constant"),
                "divide_by_d": (lambda: sdpa(q, k, v, m, scale=1 / D), "knob:scale_constant"),
                "softmax_over_queries": (
                    lambda: (
                        torch.softmax(
                            (q @ k.repeat_interleave(4, 1).transpose(-1, -2) / math.sqrt(D)).masked_fill(~m, -math.inf),
                            -2,
                        )
                        @ v.repeat_interleave(4, 1)
                    ),
                    "knob:reduction_dim",
                ),
                "scaled_by_the_number_of_keys": (
                    lambda: sdpa(q, k, v, m, scale=1 / math.sqrt(k.shape[-2])),
                    "knob:scale_constant",
                ),  # fmt: skip
                "mask_ignored": (lambda: sdpa(q, k, v), "knob:mask_missing"),
                "alibi_added": (lambda: sdpa(q, k, v, alibi_bias(H, T).masked_fill(~m, -math.inf)), "knob:score_bias"),
                "mask_inverted": (lambda: sdpa(q, k, v, ~m), "knob:mask_polarity"),
                "gqa_tiled": (lambda: sdpa(q, k.repeat(1, 4, 1, 1), v.repeat(1, 4, 1, 1), m), "knob:gqa_mapping"),
                "masked_scores_zero": (
                    lambda: (
                        torch.softmax(
                            (q @ k.repeat_interleave(4, 1).transpose(-1, -2) / math.sqrt(D)).masked_fill(~m, 0.0), -1
                        )
                        @ v.repeat_interleave(4, 1)
                    ),
                    "knob:mask_missing",
                ),
            },
        )
    )
    qf, kf, vf = q.float(), k.float(), v.float()
    out.append(
        Case(
            "scaled_dot_product_attention",
            (qf, kf, vf, m),
            {},
            sdpa(q, k, v, m),
            {"gqa_tiled_f32": (lambda: sdpa(qf, kf.repeat(1, 4, 1, 1), vf.repeat(1, 4, 1, 1), m), "knob:gqa_mapping")},
            tol=F32_ATTENTION,
        )
    )
    q7, k7, v7 = qkv(t_q=7, t_k=T + 4, seed=56)
    out.append(
        Case(
            "flash_attention",
            (q7, k7, v7),
            {"causal": True, "block_size": 4},
            sdpa(q7, k7, v7, causal(7, T + 4)),
            {
                "top_left": (
                    lambda: sdpa(q7, k7, v7, torch.ones(7, T + 4, dtype=torch.bool).tril()),
                    "knob:mask_alignment",
                )
            },
        )
    )
    xa = randn(B, T, D_MODEL, seed=58)
    wq = randn(H * D, D_MODEL, seed=59) / math.sqrt(D_MODEL)
    wk, wv = (
        randn(H_KV * D, D_MODEL, seed=60) / math.sqrt(D_MODEL),
        randn(H_KV * D, D_MODEL, seed=61) / math.sqrt(D_MODEL),
    )
    wo = randn(D_MODEL, H * D, seed=62) / math.sqrt(D_MODEL)

    def mha(
        merge_view=False, tiled=False, rope_values=False, theta=None, split_view=False, swap_kv=False, flat=None, w=None
    ):
        def split(y, h):
            return y.view(B, h, T, D) if split_view else y.view(B, T, h, D).transpose(1, 2)

        k_weight, v_weight = (wv, wk) if swap_kv else (wk, wv)
        qh, kh, vh = split(xa @ wq.T, H), split(xa @ k_weight.T, H_KV), split(xa @ v_weight.T, H_KV)
        pos = torch.arange(T)
        if flat == "before_split":  # rope(q) and rope(k) on the [B, T, width] projections
            qh, kh = (
                split(rope_complex(xa @ wq.T, pos, theta), H),
                split(rope_complex(xa @ k_weight.T, pos, theta), H_KV),
            )
        elif flat == "across_heads":  # run.c's head_dim = i without % head_size: head j turns theta ** -j as fast
            qh = torch.stack([rope_complex(qh[:, j], pos * theta**-j, theta) for j in range(H)], dim=1)
            kh = torch.stack([rope_complex(kh[:, j], pos * theta**-j, theta) for j in range(H_KV)], dim=1)
        elif theta is not None:
            pos = torch.arange(T)
            qh, kh = rope_complex(qh, pos, theta), rope_complex(kh, pos, theta)
            if rope_values:
                vh = rope_complex(vh, pos, theta)
        if tiled:
            kh, vh = kh.repeat(1, H // H_KV, 1, 1), vh.repeat(1, H // H_KV, 1, 1)
        band = causal(T, T) if w is None else causal(T, T) & (torch.arange(T)[:, None] - torch.arange(T)[None, :] < w)
        o = sdpa(qh, kh, vh, band)
        o = o.reshape(B, T, H * D) if merge_view else o.transpose(1, 2).reshape(B, T, H * D)
        return o @ wo.T

    out.append(
        Case(
            "multihead_self_attention",
            (xa, wq, wk, wv, wo, H, H_KV),
            {"theta": 10000.0},
            mha(theta=10000.0),
            {
                "merged_without_transpose": (lambda: mha(merge_view=True, theta=10000.0), "knob:head_layout"),
                "gqa_tiled": (lambda: mha(tiled=True, theta=10000.0), "knob:gqa_mapping"),
                "rope_on_values": (lambda: mha(rope_values=True, theta=10000.0), "knob:rope_target"),
                "split_without_transpose": (lambda: mha(split_view=True, theta=10000.0), "knob:head_layout"),
                "keys_and_values_exchanged": (lambda: mha(theta=10000.0, swap_kv=True), "knob:qkv_layout"),
                "rope_before_the_head_split": (lambda: mha(theta=10000.0, flat="before_split"), "knob:rope_base"),
                "rope_pairs_across_heads": (lambda: mha(theta=10000.0, flat="across_heads"), "knob:rope_base"),
            },
        )
    )
    wk_full, wv_full = (
        randn(H * D, D_MODEL, seed=63) / math.sqrt(D_MODEL),
        randn(H * D, D_MODEL, seed=64) / math.sqrt(D_MODEL),
    )

    def mha_full(per_head=False):  # MHA from one fused [wq; wk; wv] matrix, its output split as [q; k; v] or per head
        qkv = xa @ torch.cat([wq, wk_full, wv_full]).T  # [B, T, 3 H D]
        if per_head:  # GPT-NeoX's and Megatron's [H, 3, D] split, where the rows were stacked [q; k; v]
            qh, kh, vh = (qkv.view(B, T, H, 3, D)[..., i, :].transpose(1, 2) for i in range(3))
        else:
            qh, kh, vh = (y.view(B, T, H, D).transpose(1, 2) for y in qkv.split(H * D, dim=-1))
        pos = torch.arange(T)
        qh, kh = rope_complex(qh, pos, 10000.0), rope_complex(kh, pos, 10000.0)
        return sdpa(qh, kh, vh, causal(T, T)).transpose(1, 2).reshape(B, T, H * D) @ wo.T

    out.append(
        Case(
            "multihead_self_attention",
            (xa, wq, wk_full, wv_full, wo, H, H),
            {"theta": 10000.0},
            mha_full(),
            {"fused_qkv_split_per_head": (lambda: mha_full(per_head=True), "knob:qkv_layout")},
        )
    )
    out.append(
        Case(
            "multihead_self_attention",
            (xa, wq, wk, wv, wo, H, H_KV),
            {"theta": 10000.0, "window": 3},
            mha(theta=10000.0, w=3),
            {
                "window_ignored": (lambda: mha(theta=10000.0), "knob:sliding_window"),
                "window_one_too_wide": (lambda: mha(theta=10000.0, w=4), "knob:sliding_window"),
            },
        )
    )
    # losses
    N = B * T
    lg = randn(N, V, seed=33, scale=3.0)
    tg = ids(N, seed=34)
    tg[::3] = -100
    valid = tg != -100
    nll = F.cross_entropy(lg, tg, reduction="none")
    out.append(
        Case(
            "cross_entropy",
            (lg, tg),
            {},
            F.cross_entropy(lg, tg),
            {
                "ignored_counted": (lambda: nll.sum() / N, "knob:ignore_index"),
                "max_not_added_back": (lambda: (nll - lg.amax(-1))[valid].mean(), "knob:max_subtraction"),
                "summed": (lambda: nll[valid].sum(), "knob:loss_reduction"),
                "log_softmax_over_rows": (
                    lambda: -(lg.log_softmax(0).gather(1, tg.clamp(min=0)[:, None])[:, 0])[valid].mean(),
                    "knob:reduction_dim",
                ),
            },
            other=lambda out: out + 0.05,
        )
    )
    huge = randn(N, V, seed=35) * 3.0 + 1000.0  # overflows exp without the max; log(softmax) is still right here
    t_huge = ids(N, seed=36)
    spread = -(randn(N, V, seed=35) * 1e4).abs()
    spread = spread - spread.max(-1, keepdim=True).values  # no overflow, but probabilities underflow
    out.append(
        Case(
            "cross_entropy",
            (spread, t_huge),
            {},
            F.cross_entropy(spread, t_huge),
            {
                "log_of_softmax": (
                    lambda: F.nll_loss(torch.log(torch.softmax(spread, -1)), t_huge),
                    "knob:log_of_softmax",
                )
            },
            other=lambda out: out * 1.01,
        )
    )
    out.append(
        Case(
            "cross_entropy",
            (huge, t_huge),
            {},
            F.cross_entropy(huge, t_huge),
            {
                "naive_logsumexp": (
                    lambda: -(huge - huge.exp().sum(-1, keepdim=True).log()).gather(1, t_huge[:, None]).mean(),
                    "knob:max_subtraction",
                )
            },
            other=lambda out: out * 1.01,
        )
    )
    lg3 = randn(B, T, V, seed=37, scale=3.0)
    id3 = ids(B, T, seed=38)

    def ce(a, b, reduction="mean"):
        return F.cross_entropy(a.reshape(-1, V), b.reshape(-1), reduction=reduction)

    out.append(
        Case(
            "lm_loss",
            (lg3, id3),
            {},
            ce(lg3[:, :-1], id3[:, 1:]),
            {
                "unshifted": (lambda: ce(lg3, id3), "knob:label_shift"),
                "shifted_twice": (lambda: ce(lg3[:, :-2], id3[:, 2:]), "knob:label_shift"),
                "rolled": (lambda: ce(lg3, id3.roll(-1, 1)), "knob:label_shift"),
                "summed": (lambda: ce(lg3[:, :-1], id3[:, 1:], "sum"), "knob:loss_reduction"),
            },
            other=lambda out: out + 0.05,
        )
    )
    # sampling
    blg = batch_logits(31)

    def top_p_on(p_dist, top_p, rule):
        sp, order = p_dist.sort(-1, descending=True)
        cum = sp.cumsum(-1)
        keep_sorted = {"drop": cum <= top_p, "extra": (cum - sp) < top_p}[rule].clone()
        if rule == "extra":
            keep_sorted[..., 1:] |= keep_sorted[..., :-1].clone()
        keep_sorted[..., 0] = True
        return torch.zeros_like(p_dist, dtype=torch.bool).scatter(-1, order, keep_sorted)

    def renorm(p, keep):
        p = p * keep
        return p / p.sum(-1, keepdim=True)

    out.append(
        Case(
            "sampling_probs",
            (blg,),
            dict(temperature=0.5, top_p=0.9),
            sampling_probs(blg, 0.5, None, 0.9),
            {
                "top_p_before_temperature": (
                    lambda: renorm(torch.softmax(blg / 0.5, -1), sampling_probs(blg, 1.0, None, 0.9) > 0),
                    "knob:sampling_order",
                ),
                "temperature_multiplied": (lambda: sampling_probs(blg * 0.5, 1.0, None, 0.9), "knob:temperature"),
                "temperature_ignored": (lambda: sampling_probs(blg, 1.0, None, 0.9), "knob:temperature"),
                "not_renormalised": (
                    lambda: torch.softmax(blg / 0.5, -1) * (sampling_probs(blg, 0.5, None, 0.9) > 0),
                    "knob:renormalisation",
                ),
                "drops_crossing_token": (
                    lambda: renorm(torch.softmax(blg / 0.5, -1), top_p_on(torch.softmax(blg / 0.5, -1), 0.9, "drop")),
                    "knob:top_p_boundary",
                ),
                "keeps_one_more": (
                    lambda: renorm(torch.softmax(blg / 0.5, -1), top_p_on(torch.softmax(blg / 0.5, -1), 0.9, "extra")),
                    "knob:top_p_boundary",
                ),
                "keeps_the_least_probable_too": (  # min_tokens_to_keep at the wrong end of an ascending sort
                    lambda: renorm(
                        torch.softmax(blg / 0.5, -1),
                        (sampling_probs(blg, 0.5, None, 0.9) > 0)
                        | (torch.arange(blg.shape[-1]) == blg.argmin(-1, keepdim=True)),
                    ),
                    "knob:top_p_boundary",
                ),
            },
            other=lambda out: torch.softmax(blg, -1),
        )
    )
    out.append(
        Case(
            "sampling_probs",
            (blg,),
            dict(temperature=1.3, top_k=7, top_p=0.75),
            sampling_probs(blg, 1.3, 7, 0.75),
            {
                "top_p_ignored_beside_top_k": (lambda: sampling_probs(blg, 1.3, 7), "knob:sampling_order"),
                "top_k_ignored_beside_top_p": (lambda: sampling_probs(blg, 1.3, None, 0.75), "knob:sampling_order"),
            },
            other=lambda out: torch.softmax(blg, -1),
        )
    )
    out.append(
        Case(
            "sampling_probs",
            (blg,),
            dict(temperature=1.9, top_k=5),
            sampling_probs(blg, 1.9, 5),
            {
                "top_k_plus_1": (lambda: sampling_probs(blg, 1.9, 6), "knob:top_k"),
                "top_k_minus_1": (lambda: sampling_probs(blg, 1.9, 4), "knob:top_k"),
            },
            other=lambda out: sampling_probs(blg, 1.9, 5).roll(1, -1),
        )
    )
    return out


CASES = cases()
POSITIVE = [(c, label) for c in CASES for label in c.bugs]
