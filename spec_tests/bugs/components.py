"""Catalogued mistakes in the component functions: primitives, norms, positions, MLPs, losses."""

from __future__ import annotations

from .bug import Bug
from .model_components import MODEL

BUGS = (
    # ------------------------------------------------------------------ primitives
    Bug(
        "linear_weight_not_transposed",
        "layout",
        ("linear", "multihead_self_attention", "swiglu", "gelu_mlp", *MODEL),
        "primitives.py",
        old="    y = x @ weight.T",
        new="    y = x @ weight",
        explanation="linear computes x @ W instead of x @ W.T, reading W as [in_features, out_features]",
        fix="weights are stored [out_features, in_features]: compute x @ W.T (+ b)",
    ),
    Bug(
        "embedding_rows_scaled_by_sqrt_d_model",
        "wiring",
        ("embedding", *MODEL),
        "primitives.py",
        old="    return weight[ids]",
        new="    return weight[ids] * weight.shape[-1] ** 0.5  # the bug: the original Transformer's scale",
        explanation="embedding multiplies the rows by sqrt(d_model) (the original Transformer's embedding scale, "
        "written into the lookup), so every model's embeddings are scaled too",
        fix="give the rows as they are: only embed_scale (Gemma's) scales the token embeddings, in the model",
        code="knob:embed_scale",
    ),
    Bug(
        "softmax_ignores_dim",
        "softmax_dim",
        ("softmax",),
        "primitives.py",
        old="""    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)""",
        new="""    shifted = x - x.amax(dim=-1, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=-1, keepdim=True)""",
        explanation="softmax always normalises over the last axis, whatever dim it is given",
        fix="take the max and the sum over the dim argument",
        corner=True,
    ),
    Bug(
        "softmax_max_over_last_axis",
        "softmax_dim",
        ("softmax",),
        "primitives.py",
        old="    shifted = x - x.amax(dim=dim, keepdim=True)",
        new="    shifted = x - x.amax(dim=-1, keepdim=True)",
        explanation="the stabilising max is taken over the last axis whatever dim is: along dim it varies, so it no "
        "longer cancels",
        fix="subtract x.amax(dim=dim, keepdim=True), over the axis the sum runs over",
    ),
    Bug(
        "softmax_no_max_subtraction",
        "stability",
        ("softmax",),
        "primitives.py",
        old="    shifted = x - x.amax(dim=dim, keepdim=True)",
        new="    shifted = x",
        explanation="softmax takes exp of the raw inputs, which overflows to inf (then NaN) for inputs near 1e4",
        fix="subtract the row max before exp: softmax(x) = softmax(x - max(x))",
        corner=True,
    ),
    # ------------------------------------------------------------------ norms
    Bug(
        "rmsnorm_eps_outside_root",
        "rmsnorm",
        ("rmsnorm", *MODEL),
        "norms.py",
        old="    normed = xf * torch.rsqrt(mean_last(xf * xf) + eps)",
        new="    normed = xf / (torch.sqrt(mean_last(xf * xf)) + eps)",
        explanation="rmsnorm divides by sqrt(mean(x**2)) + eps, with eps outside the square root",
        fix="divide by sqrt(mean(x**2) + eps): eps goes inside the root",
        corner=True,
    ),
    Bug(
        "layernorm_unbiased_variance",
        "layernorm",
        ("layernorm", *MODEL),
        "norms.py",
        old="    var = mean_last(centred * centred)",
        new="    var = centred.var(dim=-1, keepdim=True)",
        explanation="layernorm uses the unbiased variance (divides by d - 1), unlike F.layer_norm",
        fix="use the biased variance mean((x - mean)**2), e.g. x.var(dim=-1, unbiased=False)",
    ),
    Bug(
        "layernorm_mean_over_padded_blocks",
        "layernorm",
        ("layernorm", *MODEL),
        "norms.py",
        old="    centred = xf - mean_last(xf)",
        new="    centred = xf - xf.sum(-1, keepdim=True) / (-(-xf.shape[-1] // 64) * 64)  # blocks of 64 counted full",
        explanation="layernorm's mean divides the row's sum by a whole number of 64-wide blocks (a block loop's "
        "partial last block counted as full)",
        fix="divide by the number of entries: mean over the last axis",
    ),
    Bug(
        "norm_statistics_in_input_dtype",
        "precision",
        ("rmsnorm", "layernorm"),
        "norms.py",
        old="    return torch.promote_types(x.dtype, torch.float32)",
        new="    return x.dtype",
        explanation="norm statistics are computed in the input dtype, so float16 squares overflow to inf",
        fix="upcast to at least float32 for mean(x**2) and the variance, cast the result back",
        corner=True,
    ),
    # ------------------------------------------------------------------ positions
    Bug(
        "rope_frequency_exponent",
        "rope_frequency",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head",
        new="    exponents = torch.arange(0, d_head // 2, dtype=torch.float64) / d_head",
        explanation="RoPE pair i turns at theta**(-i/d_head) instead of theta**(-2i/d_head)",
        fix="use exponents 2i/d_head for i < d_head/2, i.e. torch.arange(0, d_head, 2) / d_head",
    ),
    Bug(
        "rope_pairs_counted_from_one",
        "rope_frequency",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head",
        new="    exponents = torch.arange(2, d_head + 2, 2, dtype=torch.float64) / d_head  # the bug: k = 1 .. d/2",
        explanation="RoPE's pairs are counted from 1 (theta ** (-2k / d) for k = 1 .. d/2, a handout's 1-indexed k "
        "without its -1): each pair turns at the next pair's frequency, and the first pair no longer turns by 1 "
        "radian per position",
        fix="count pairs from 0: theta ** (-2i / d_head) for i = 0 .. d_head/2 - 1",
        code="knob:rope_base",
    ),
    Bug(
        "rope_frequencies_inverted",
        "rope_frequency",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="    return theta ** (-exponents)",
        new="    return theta**exponents",
        explanation="RoPE's frequencies are theta ** (+2i / d_head): the reciprocal of the inverse frequencies (the "
        "1 / dropped), so every pair but the first turns far too fast",
        fix="inverse frequencies theta ** (-2i / d_head)",
        code="knob:rope_base",
    ),
    Bug(
        "rope_rotation_reversed",
        "rope",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)",
        new="    rotated = torch.stack((x0 * cos + x1 * sin, -x0 * sin + x1 * cos), dim=-1)",
        explanation="RoPE rotates each pair by minus the angle (the sin terms have the wrong sign)",
        fix="(x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)",
        code="sign",
    ),
    Bug(
        "rope_tables_laid_out_for_the_other_pairing",
        "rope",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="""    pairs = rearrange(x, _PAIR_PATTERN[check_rope_style(style)], two=2)
    x0, x1 = pairs[..., 0], pairs[..., 1]""",
        new="""    d = x.shape[-1]  # the bug: per-channel cos/sin tables laid out for the other pairing
    if check_rope_style(style) == "half":
        c, s = (rearrange(torch.stack((t, t), -1), "... i two -> ... (i two)") for t in (cos, sin))
        turned = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1)
    else:
        c, s = (torch.cat((t, t), -1) for t in (cos, sin))
        turned = rearrange(torch.stack((-x[..., 1::2], x[..., 0::2]), -1), "... i two -> ... (i two)")
    return x * c + turned * s
    pairs = rearrange(x, _PAIR_PATTERN[check_rope_style(style)], two=2)
    x0, x1 = pairs[..., 0], pairs[..., 1]""",
        explanation="the cos/sin tables are laid out per channel for the other pairing (f0, f0, f1, f1 beside "
        "rotate_half, or cat(freqs, freqs) beside every-two pairs): each channel turns at another pair's frequency",
        fix="lay the tables out as the rotation pairs channels: cat(freqs, freqs) for rotate_half, "
        "repeat_interleave(2) for (2i, 2i+1) pairs",
        code="knob:rope_style",
    ),
    Bug(
        "rope_half_pairs_declared_interleaved",
        "rope",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="""    pairs = rearrange(x, _PAIR_PATTERN[check_rope_style(style)], two=2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rearrange(rotated, _UNPAIR_PATTERN[style])""",
        new="""    pairs = rearrange(x, _PAIR_PATTERN["half"], two=2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rearrange(rotated, _UNPAIR_PATTERN["half"])""",
        explanation="RoPE rotates pairs (i, i + d/2) (GPT-NeoX/Hugging "
        "Face) while ROPE_STYLE says interleaved (2i, 2i+1)",
        fix="rotate the pairs of the style you declare, or declare ROPE_STYLE = 'half'",
        code="knob:rope_style",
    ),
    Bug(
        "sinusoidal_sin_cos_halves",
        "sinusoidal",
        ("sinusoidal_positions",),
        "positions.py",
        old='"p i two -> p (i two)"',
        new='"p i two -> p (two i)"',
        explanation="the sinusoidal table puts all sines first and all cosines after, instead of interleaving them",
        fix="pe[:, 0::2] = sin(angle), pe[:, 1::2] = cos(angle)",
    ),
    Bug(
        "rope_complex_view_of_a_strided_input",
        "leading_dims",
        ("rope",),
        "positions.py",
        old="    pairs = rearrange(x, _PAIR_PATTERN[check_rope_style(style)], two=2)\n",
        new="    pairs = rearrange(x, _PAIR_PATTERN[check_rope_style(style)], two=2)\n"
        '    if style == "interleaved" and x.dtype in (torch.float32, torch.float64):  # the bug: a complex view\n'
        "        pairs = torch.view_as_real(torch.view_as_complex(pairs))  # needs a unit-stride last axis\n",
        explanation="rope pairs the channels through a complex view (torch.view_as_complex, as TorchTitan's "
        "apply_rotary_emb): it raises for an x whose last axis is not unit-stride",
        fix="x.contiguous() (or reshape) before the complex view, or rotate the pairs with real arithmetic",
        corner=True,
    ),
    # ------------------------------------------------------------------ MLPs
    Bug(
        "swiglu_batched_input_only",
        "leading_dims",
        ("swiglu",),
        "mlp.py",
        old="    return linear(silu(linear(x, w_gate), fused=fused) * linear(x, w_up), w_down)",
        new="    b, t, d = x.shape  # the model's [B, T, d]\n"
        "    return linear(silu(linear(x, w_gate), fused=fused) * linear(x, w_up), w_down)",
        explanation="swiglu unpacks x as [B, T, d]: it raises for any other number of leading dims",
        fix="work on the last axis only (x @ w.T broadcasts over any leading dims); never unpack the shape",
        corner=True,
    ),
    Bug(
        "swiglu_gate_up_swapped",
        "swiglu",
        ("swiglu", *MODEL),
        "mlp.py",
        old="    return linear(silu(linear(x, w_gate), fused=fused) * linear(x, w_up), w_down)",
        new="    return linear(linear(x, w_gate) * silu(linear(x, w_up), fused=fused), w_down)",
        explanation="SiLU is applied to the up projection instead of the gate",
        fix="silu(x @ w_gate.T) * (x @ w_up.T): only the gate goes through SiLU",
    ),
    Bug(
        "gelu_exact_instead_of_tanh",
        "gelu",
        ("gelu_mlp", *MODEL),
        "mlp.py",
        old="    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))",
        new="    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))",
        explanation="the GPT-2 MLP uses the exact (erf) GELU instead of the tanh approximation GPT-2 was trained with",
        fix="use the tanh approximation: F.gelu(x, approximate='tanh')",
    ),
    # ------------------------------------------------------------------ losses
    Bug(
        "lm_loss_unshifted_labels",
        "unshifted_labels",
        ("lm_loss",),
        "losses.py",
        old="return cross_entropy(logits[:, :-1], ids[:, 1:])",
        new="return cross_entropy(logits, ids)",
        explanation="lm_loss scores the logits at t against the token at t (the input itself), not the next one",
        fix="cross_entropy(logits[:, :-1], ids[:, 1:]): position t predicts token t+1",
    ),
    Bug(
        "lm_loss_shifted_backwards",
        "unshifted_labels",
        ("lm_loss",),
        "losses.py",
        old="return cross_entropy(logits[:, :-1], ids[:, 1:])",
        new="return cross_entropy(logits[:, 1:], ids[:, :-1])",
        explanation="lm_loss shifts the wrong way: logits at t+1 are scored against the token at t",
        fix="cross_entropy(logits[:, :-1], ids[:, 1:]): drop the last logit and the first id",
    ),
    Bug(
        "lm_loss_slices_without_shifting",
        "unshifted_labels",
        ("lm_loss",),
        "losses.py",
        old="return cross_entropy(logits[:, :-1], ids[:, 1:])",
        new="return cross_entropy(logits[:, :-1], ids[:, :-1])",
        explanation="lm_loss drops the last logit but does not shift the labels: each position is scored against its "
        "own token (tgt_y = tgt[:, :-1] for tgt[:, 1:])",
        fix="cross_entropy(logits[:, :-1], ids[:, 1:]): drop the last logit and the first id",
    ),
    Bug(
        "cross_entropy_counts_ignored",
        "ignore_index",
        ("cross_entropy", "lm_loss"),
        "losses.py",
        old="    return nll.sum() / (targets != ignore_index).sum()",
        new="    return nll.mean()",
        explanation="cross_entropy averages over every target, so ignored targets count as zero-loss tokens",
        fix="divide the summed NLL by the number of targets != ignore_index",
        corner=True,
    ),
    Bug(
        "cross_entropy_ignored_rows_zeroed_without_grad",
        "ignore_index",
        ("cross_entropy",),
        "losses.py",
        old="    return torch.where(keep, nll, torch.zeros_like(nll))",
        new="""    nll = nll.clone()
    with torch.no_grad():  # the bug: the ignored rows are zeroed where autograd does not see it
        nll[~keep] = 0.0
    return nll""",
        explanation="the ignored targets' losses are zeroed under torch.no_grad(), so the loss leaves them out but the "
        "backward pass still gives their rows the gradient of target 0",
        fix="mask with torch.where(keep, nll, 0) (or multiply by the mask) inside the graph",
        corner=True,
    ),
    Bug(
        "cross_entropy_no_max_subtraction",
        "stability",
        ("cross_entropy", "lm_loss"),
        "losses.py",
        old="    shifted = x - x.amax(dim=dim, keepdim=True)",
        new="    shifted = x",
        explanation="log-softmax takes exp of raw logits, so the loss is inf/NaN for logits near 1e4",
        fix="log_softmax(x) = x - max - log(sum(exp(x - max)))",
        corner=True,
    ),
    Bug(
        "rope_exponents_linspace",
        "rope_frequency",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head",
        new="    exponents = torch.linspace(0, 1, d_head // 2, dtype=torch.float64)  # the speedrun's grid",
        explanation="RoPE's exponents run over a linspace(0, 1, d_head/2) grid, so pair i turns at "
        "theta**(-i/(d_head/2 - 1)) and the last pair at 1/theta, instead of theta**(-2i/d_head)",
        fix="exponents 2i/d_head for i < d_head/2: torch.arange(0, d_head, 2) / d_head",
        corner=True,
        code="knob:rope_base",
    ),
    Bug(
        "rope_model_table_loses_its_sine",
        "rope",
        MODEL,
        "positions.py",
        old="        return angles.cos().to(dtype), angles.sin().to(dtype)\n",
        new="        return angles.cos().to(dtype), torch.zeros_like(angles).to(dtype)  # a complex table made real\n",
        explanation="the model's rotary table keeps only the cosine (a complex freqs_cis buffer that model.to(dtype) "
        "cast to a real dtype, its imaginary part discarded): each query and key channel is multiplied by cos(angle), "
        "never rotated; the rope function itself is right",
        fix="rotate each pair by (cos, sin); keep complex tables out of the module's buffers, or store cos and sin",
        corner=True,
        code="knob:rope_table",
    ),
    Bug(
        "rope_table_sin_for_cos",
        "rope",
        ("rope", "multihead_self_attention", *MODEL),
        "positions.py",
        old="        cos, sin = angles.cos().to(compute), angles.sin().to(compute)",
        new="        sin, cos = angles.cos().to(compute), angles.sin().to(compute)  # the table stacked (sin, cos)",
        explanation="RoPE's table holds sin where cos belongs and cos where sin, so every pair is turned by a "
        "quarter turn minus the specified angle",
        fix="cos, sin = angles.cos(), angles.sin(): cos multiplies the pair's own entries",
        corner=True,
        code="knob:rope_table",
    ),
)
