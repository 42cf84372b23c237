"""Independently seeded bugs: each one plausible mistake, as a small source patch on one of the three
independent implementations in this folder.

Written from docs/protocol.md, the course notes and general knowledge only (not from any bug catalog
of the project). ``accepted`` lists the diagnosis cause codes (spec_tests/harness/diagnosis/codes.py)
that would name the bug correctly; an empty tuple means no code of that vocabulary describes it
(see README.md for the gaps).

``materialize(bug, into)`` writes a patched copy of the base package and returns its folder, loadable
with ``--impl=<folder>``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from spec_tests.bugs.bug import replace_once

HERE = Path(__file__).resolve().parent

MODULAR = "modular_interleaved"
HALF = "half_f32_mha"
FUNCTIONAL = "functional_mixed"
META = "meta_complex"  # written later, only as correct implementations: no seeded bug uses them
STUDENT = "student_mha_tied"
BASES = (MODULAR, HALF, FUNCTIONAL, META, STUDENT)


@dataclass(frozen=True)
class SeededBug:
    name: str  # snake_case, unique
    base: str  # implementation folder under tests/independent/
    file: str  # file inside it (relative)
    old: str  # exact source text, must occur exactly once in that file
    new: str  # replacement
    mistake: str  # one line: what the buggy code does
    accepted: tuple[str, ...]  # cause codes that would name this bug correctly


SEEDED: tuple[SeededBug, ...] = (
    # ------------------------------------------------------------------ layout after reshape/transpose
    SeededBug(
        name="merge_heads_without_transpose",
        base=MODULAR,
        file="ops.py",
        old="    return x.transpose(1, 2).contiguous().view(b, t, h * dh)",
        new="    return x.contiguous().view(b, t, h * dh)",
        mistake="merges [B, H, T, dh] heads straight into [B, T, H*dh] without moving heads back behind time",
        accepted=("layout",),
    ),
    SeededBug(
        name="split_heads_by_view",
        base=MODULAR,
        file="ops.py",
        old="    return x.view(b, t, n_heads, -1).transpose(1, 2)",
        new="    return x.view(b, n_heads, t, -1)",
        mistake="splits [B, T, H*dh] into heads with one view to [B, H, T, dh] instead of view + transpose",
        accepted=("layout",),
    ),
    SeededBug(
        name="merge_heads_mixes_batch_and_time",
        base=MODULAR,
        file="ops.py",
        old="    return x.transpose(1, 2).contiguous().view(b, t, h * dh)",
        new="    return x.permute(2, 0, 1, 3).reshape(b, t, h * dh)",
        mistake="merges heads with a permute that puts time first, so rows of different sequences are interleaved",
        accepted=("layout", "batch_mixing"),
    ),
    SeededBug(
        name="linear_weight_not_transposed",
        base=MODULAR,
        file="ops.py",
        old="    y = torch.matmul(x, weight.transpose(0, 1))",
        new="    y = torch.matmul(x, weight.reshape(weight.shape[1], weight.shape[0]))",
        mistake="reshapes W [out, in] to [in, out] instead of transposing it (right shape, scrambled values)",
        accepted=("layout",),
    ),
    # ------------------------------------------------------------------------ masks and attention maths
    SeededBug(
        name="mask_of_first_sequence_for_all",
        base=MODULAR,
        file="ops.py",
        old='            scores = scores.masked_fill(~mask, float("-inf"))',
        new='            scores = scores.masked_fill(~(mask[0] if mask.dim() == 4 else mask), float("-inf"))',
        mistake="drops the batch axis of a 4-D mask by indexing [0]: sequence 0's mask is used for every sequence",
        accepted=("mask", "batch_mixing"),
    ),
    SeededBug(
        name="softmax_over_queries",
        base=MODULAR,
        file="ops.py",
        old="    return torch.matmul(softmax(scores, dim=-1), v)",
        new="    return torch.matmul(softmax(scores, dim=-2), v)",
        mistake="normalises attention scores over the query axis instead of the key axis",
        accepted=("knob:reduction_dim",),
    ),
    SeededBug(
        name="softmax_ignores_dim_argument",
        base=FUNCTIONAL,
        file="fn.py",
        old="    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))",
        new="    return torch.exp(x - torch.logsumexp(x, dim=-1, keepdim=True))",
        mistake="the softmax primitive always normalises over the last axis, whatever dim it is given",
        accepted=("knob:reduction_dim",),
    ),
    SeededBug(
        name="no_attention_scale",
        base=MODULAR,
        file="ops.py",
        old="    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])",
        new="    scores = torch.matmul(q, k.transpose(-2, -1))",
        mistake="attention scores are not divided by sqrt(d_head)",
        accepted=("knob:scale_constant", "scale"),
    ),
    SeededBug(
        name="scale_by_sqrt_d_model",
        base=HALF,
        file="modeling.py",
        old="        self.scaling = self.head_dim**-0.5",
        new="        self.scaling = self.hidden_size**-0.5",
        mistake="the model scales attention scores by 1/sqrt(d_model) instead of 1/sqrt(d_head)",
        accepted=("knob:scale_constant",),
    ),
    SeededBug(
        name="flash_scale_by_d_head",
        base=FUNCTIONAL,
        file="fn.py",
        old="    scale = q.shape[-1] ** -0.5",
        new="    scale = q.shape[-1] ** -1",
        mistake="flash attention divides the scores by d_head instead of sqrt(d_head)",
        accepted=("knob:scale_constant",),
    ),
    SeededBug(
        name="causal_mask_hides_diagonal",
        base=MODULAR,
        file="ops.py",
        old="    return cols <= rows + (t_k - t_q)",
        new="    return cols < rows + (t_k - t_q)",
        mistake="the causal mask uses < instead of <=, so a token cannot attend to itself (the first row has no key)",
        accepted=("knob:mask_alignment", "mask", "nan_rows"),
    ),
    SeededBug(
        name="causal_mask_top_left",
        base=FUNCTIONAL,
        file="fn.py",
        old="    future = torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(t_k - t_q + 1)",
        new="    future = torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1)",
        mistake="causal_mask is aligned top-left: with t_q < t_k the queries cannot see the last keys",
        accepted=("knob:mask_alignment", "mask"),
    ),
    SeededBug(
        name="is_causal_with_cached_keys",
        base=FUNCTIONAL,
        file="model.py",
        old="    if t_k == t:",
        new="    if t_k >= t:",
        mistake="the model uses SDPA's is_causal (top-left aligned) also when cached keys make T_k > T_q",
        accepted=("knob:mask_alignment", "mask"),
    ),
    SeededBug(
        name="mask_polarity_inverted",
        base=MODULAR,
        file="ops.py",
        old='            scores = scores.masked_fill(~mask, float("-inf"))',
        new='            scores = scores.masked_fill(mask, float("-inf"))',
        mistake="takes True in a boolean mask as 'masked' instead of 'may attend'",
        # nan_rows by its description: the inverted causal mask leaves the last row with every entry masked
        accepted=("knob:mask_polarity", "mask", "nan_rows"),
    ),
    SeededBug(
        name="softmax_without_max_subtraction",
        base=MODULAR,
        file="ops.py",
        old="    shifted = x - x.amax(dim=dim, keepdim=True)",
        new="    shifted = x",
        mistake="softmax exponentiates the raw inputs: exp overflows to inf for inputs near 1e4",
        accepted=(
            "overflow",
            "knob:max_subtraction",
            "nan_rows",
        ),
    ),
    SeededBug(
        name="cross_entropy_without_max_subtraction",
        base=MODULAR,
        file="ops.py",
        old="    row_max = flat.amax(dim=-1, keepdim=True)",
        new="    row_max = torch.zeros_like(flat[:, :1])",
        mistake="cross_entropy's log-sum-exp does not subtract the row max: inf loss for logits near 1e4",
        accepted=(
            "overflow",
            "knob:max_subtraction",
        ),
    ),
    # ------------------------------------------------------------------------------------ flash attention
    SeededBug(
        name="flash_drops_partial_last_block",
        base=FUNCTIONAL,
        file="fn.py",
        old="    for lo in range(0, t_k, block_size):",
        new="    for lo in range(0, (t_k // block_size) * block_size, block_size):",
        mistake="flash attention iterates over whole key blocks only, so the keys of a last partial block are skipped",
        accepted=("boundary",),
    ),
    SeededBug(
        name="flash_accumulator_not_rescaled",
        base=MODULAR,
        file="ops.py",
        old="            acc = acc * correction + torch.matmul(p, vb)",
        new="            acc = acc + torch.matmul(p, vb)",
        mistake="flash attention rescales the running sum but not the output accumulator when the running max grows",
        accepted=("boundary",),
    ),
    SeededBug(
        name="flash_tiles_kv_heads",
        base=FUNCTIONAL,
        file="fn.py",
        old="    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)",
        new="    k, v = torch.cat([k] * n_rep, dim=-3), torch.cat([v] * n_rep, dim=-3)",
        mistake="flash attention shares kv heads by tiling (head h uses kv head h % n_kv) instead of repeat_interleave",
        accepted=("knob:gqa_mapping",),
    ),
    # ------------------------------------------------------------------------------------------- GQA
    SeededBug(
        name="repeat_kv_tiles",
        base=MODULAR,
        file="ops.py",
        old="    return x.unsqueeze(-3).expand(*lead, h, n_rep, t, d).reshape(*lead, h * n_rep, t, d)",
        new="    return x.unsqueeze(-4).expand(*lead, n_rep, h, t, d).reshape(*lead, h * n_rep, t, d)",
        mistake="repeat_kv tiles the kv heads (h % n_kv) instead of interleaving them (h // n_rep)",
        accepted=("knob:gqa_mapping",),
    ),
    # ------------------------------------------------------------------------------------------- RoPE
    SeededBug(
        name="rope_on_values",
        base=MODULAR,
        file="layers.py",
        old="            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)",
        new="            q, k, v = rope(q, pos, self.theta), rope(k, pos, self.theta), rope(v, pos, self.theta)",
        mistake="the attention layer rotates the values as well as the queries and keys",
        accepted=("knob:rope_target",),
    ),
    SeededBug(
        name="rope_half_pairs_in_interleaved_impl",
        base=MODULAR,
        file="ops.py",
        old=(
            "    even, odd = x[..., 0::2], x[..., 1::2]\n"
            "    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)\n"
            "    return rotated.flatten(-2)\n"
        ),
        new=(
            "    even, odd = x[..., : d // 2], x[..., d // 2 :]\n"
            "    return torch.cat((even * cos - odd * sin, even * sin + odd * cos), dim=-1)\n"
        ),
        mistake="rope pairs channels (i, i + d/2) (GPT-NeoX style) while the package declares ROPE_STYLE interleaved",
        accepted=("knob:rope_style", "rope_pairing"),
    ),
    SeededBug(
        name="rope_exponent_i_not_2i",
        base=FUNCTIONAL,
        file="fn.py",
        old="    freqs = torch.exp(-math.log(theta) * torch.arange(0, d, 2, device=x.device, dtype=real.dtype) / d)",
        new="    freqs = torch.exp(-math.log(theta) * torch.arange(0, d // 2, device=x.device, dtype=real.dtype) / d)",
        mistake="the RoPE frequency of pair i is theta**(-i/d) instead of theta**(-2i/d)",
        accepted=("knob:rope_base",),
    ),
    SeededBug(
        name="rope_exponent_over_d_model",
        base=HALF,
        file="modeling.py",
        old="        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(STATS) / head_dim",
        new='        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(STATS) / config["d_model"]',
        mistake="the model's rotary table divides the exponent by d_model instead of d_head",
        accepted=("knob:rope_base",),
    ),
    SeededBug(
        name="rope_theta_ignored_in_model",
        base=FUNCTIONAL,
        file="model.py",
        old='        q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])',
        new="        q, k = rope(q, pos), rope(k, pos)",
        mistake="the model calls rope with its default theta 10000, ignoring config rope_theta",
        accepted=("knob:rope_theta",),
    ),
    SeededBug(
        name="rope_rotates_backwards",
        base=FUNCTIONAL,
        file="fn.py",
        old="    rotation = torch.polar(torch.ones_like(angles), angles)",
        new="    rotation = torch.polar(torch.ones_like(angles), -angles)",
        mistake="rope rotates each pair by -angle (the conjugate rotation)",
        accepted=("sign",),
    ),
    SeededBug(
        name="rope_tables_in_float32",
        base=MODULAR,
        file="ops.py",
        old="    table_dtype = _stat_dtype(x.dtype)",
        new="    table_dtype = torch.float32",
        mistake="rope builds its angle and cos/sin tables in float32 even for float64 inputs",
        accepted=("precision",),
    ),
    # ----------------------------------------------------------------------------- positions and cache
    SeededBug(
        name="rope_positions_restart_in_cache",
        base=MODULAR,
        file="layers.py",
        old="            pos = torch.arange(start, start + t, device=x.device)",
        new="            pos = torch.arange(t, device=x.device)",
        mistake="with a cache, new tokens are rotated from position 0 instead of continuing from the cache length",
        accepted=("knob:position_offset",),
    ),
    SeededBug(
        name="rope_positions_start_at_one",
        base=FUNCTIONAL,
        file="model.py",
        old="        pos = torch.arange(start, start + t, device=x.device)",
        new="        pos = torch.arange(start + 1, start + t + 1, device=x.device)",
        mistake="the model numbers positions from 1: logits are unchanged (RoPE is relative) but cached keys are not",
        accepted=("knob:position_offset",),
    ),
    SeededBug(
        name="gpt2_positions_restart_in_cache",
        base=FUNCTIONAL,
        file="model.py",
        old='        x = x + model.p("pos_embeddings.weight")[start : start + t]',
        new='        x = x + model.p("pos_embeddings.weight")[:t]',
        mistake="gpt2's learned positions are taken from 0 for every chunk instead of continuing after the cache",
        accepted=("knob:position_offset",),
    ),
    SeededBug(
        name="hf_positions_restart_in_cache",
        base=HALF,
        file="modeling.py",
        old="        position_ids = torch.arange(past_seen, past_seen + input_ids.shape[1], device=input_ids.device)",
        new="        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)",
        mistake="position ids ignore the tokens already in the cache",
        accepted=("knob:position_offset",),
    ),
    SeededBug(
        name="cache_concat_on_head_axis",
        base=MODULAR,
        file="layers.py",
        old="            self.k = torch.cat((self.k, k), dim=2)\n            self.v = torch.cat((self.v, v), dim=2)",
        new="            self.k = torch.cat((self.k, k), dim=1)\n            self.v = torch.cat((self.v, v), dim=1)",
        mistake="the KV cache appends new keys/values along the head axis instead of the time axis",
        accepted=("layout", "shape", "cache_fill"),  # a crash's trigger: a filled cache (an empty one runs)
    ),
    SeededBug(
        name="cache_stores_unrotated_keys",
        base=MODULAR,
        file="layers.py",
        old=(
            "        if self.theta is not None:\n"
            "            pos = torch.arange(start, start + t, device=x.device)\n"
            "            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)\n"
            "        if kv is not None:\n"
            "            k, v = kv.append(k, v)\n"
        ),
        new=(
            "        if kv is not None:\n"
            "            k, v = kv.append(k, v)\n"
            "        if self.theta is not None:\n"
            "            q = rope(q, torch.arange(start, start + t, device=x.device), self.theta)\n"
            "            k = rope(k, torch.arange(k.shape[2], device=x.device), self.theta)\n"
        ),
        mistake="caches keys before RoPE and rotates all keys after reading the cache: same logits, wrong cache",
        accepted=(
            "noop",
            "knob:cache_contents",
        ),
    ),
    SeededBug(
        name="cache_overflow_not_checked",
        base=FUNCTIONAL,
        file="model.py",
        old='    if start + t > cfg["context_length"]:',
        new='    if t > cfg["context_length"]:',
        mistake="forward checks only the new tokens against context_length, not cached + new",
        accepted=("boundary",),
    ),
    SeededBug(
        name="context_check_off_by_one",
        base=MODULAR,
        file="layers.py",
        old="        if start + t > ctx:",
        new="        if start + t >= ctx:",
        mistake="forward rejects exactly context_length tokens (>= instead of >)",
        accepted=("boundary",),
    ),
    # ------------------------------------------------------------------------------------------ norms
    SeededBug(
        name="rmsnorm_eps_outside_root",
        base=MODULAR,
        file="ops.py",
        old="    inv_rms = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + eps)",
        new="    inv_rms = 1.0 / (torch.sqrt(xs.pow(2).mean(dim=-1, keepdim=True)) + eps)",
        mistake="rmsnorm adds eps to the root instead of under it: x / (sqrt(mean(x^2)) + eps)",
        accepted=("knob:eps_placement",),
    ),
    SeededBug(
        name="rmsnorm_eps_argument_ignored",
        base=FUNCTIONAL,
        file="fn.py",
        old="    return (h / torch.sqrt(ms + eps)).to(x.dtype) * weight",
        new="    return (h / torch.sqrt(ms + 1e-5)).to(x.dtype) * weight",
        mistake="rmsnorm hard-codes eps = 1e-5 and ignores its eps argument",
        accepted=("knob:eps_value",),
    ),
    SeededBug(
        name="rmsnorm_subtracts_mean",
        base=MODULAR,
        file="ops.py",
        old="    xs = x.to(_stat_dtype(x.dtype))\n    inv_rms",
        new="    xs = x.to(_stat_dtype(x.dtype))\n    xs = xs - xs.mean(dim=-1, keepdim=True)\n    inv_rms",
        mistake="rmsnorm centres x first (a LayerNorm without bias) instead of using the raw root mean square",
        accepted=("knob:mean_subtraction",),
    ),
    SeededBug(
        name="rmsnorm_statistic_over_whole_tensor",
        base=MODULAR,
        file="ops.py",
        old="    inv_rms = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + eps)",
        new="    inv_rms = torch.rsqrt(xs.pow(2).mean() + eps)",
        mistake="rmsnorm takes the mean of squares over the whole tensor (all tokens of all sequences), not per vector",
        accepted=("knob:reduction_dim", "batch_mixing"),
    ),
    SeededBug(
        name="layernorm_unbiased_variance",
        base=FUNCTIONAL,
        file="fn.py",
        old="    var, mean = torch.var_mean(h, dim=-1, keepdim=True, correction=0)",
        new="    var, mean = torch.var_mean(h, dim=-1, keepdim=True)",
        mistake="layernorm uses torch's default unbiased (n-1) variance",
        accepted=("knob:variance_bias",),
    ),
    SeededBug(
        name="layernorm_weight_forgotten",
        base=MODULAR,
        file="ops.py",
        old="    return (centred / torch.sqrt(var + eps)).to(x.dtype) * weight + bias",
        new="    return (centred / torch.sqrt(var + eps)).to(x.dtype) + bias",
        mistake="layernorm adds the bias but never multiplies by the weight",
        accepted=("knob:norm_weight",),
    ),
    SeededBug(
        name="rmsnorm_statistics_in_input_dtype",
        base=FUNCTIONAL,
        file="fn.py",
        old="    h = _at_least_f32(x)\n    ms =",
        new="    h = x\n    ms =",
        mistake="rmsnorm squares float16 inputs in float16, which overflows for values near 300",
        accepted=("precision", "dtype"),
    ),
    # ----------------------------------------------------------------------------------- MLP and blocks
    SeededBug(
        name="swiglu_silu_on_up_branch",
        base=MODULAR,
        file="ops.py",
        old="    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)",
        new="    return linear(linear(x, w_gate) * silu(linear(x, w_up)), w_down)",
        mistake="SwiGLU applies SiLU to the up projection instead of the gate",
        accepted=("knob:activation",),
    ),
    SeededBug(
        name="gelu_exact_instead_of_tanh",
        base=FUNCTIONAL,
        file="fn.py",
        old='    return linear(F.gelu(linear(x, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)',
        new="    return linear(F.gelu(linear(x, w_fc, b_fc)), w_proj, b_proj)",
        mistake="the GPT-2 MLP uses the exact erf GELU instead of the tanh approximation",
        accepted=("knob:activation",),
    ),
    SeededBug(
        name="silu_sign_flipped",
        base=FUNCTIONAL,
        file="fn.py",
        old="    return x / (1 + torch.exp(-x))",
        new="    return x / (1 + torch.exp(x))",
        mistake="silu computes x * sigmoid(-x)",
        accepted=("knob:activation", "sign"),
    ),
    SeededBug(
        name="post_norm_blocks",
        base=MODULAR,
        file="layers.py",
        old=(
            "        x = x + self.resid_drop(self.attn(self.attn_norm(x), start, kv))\n"
            "        return x + self.resid_drop(self.mlp(self.mlp_norm(x)))\n"
        ),
        new=(
            "        x = self.attn_norm(x + self.resid_drop(self.attn(x, start, kv)))\n"
            "        return self.mlp_norm(x + self.resid_drop(self.mlp(x)))\n"
        ),
        mistake="blocks are post-norm (norm after the residual add) instead of pre-norm",
        accepted=("knob:norm_placement",),
    ),
    SeededBug(
        name="final_norm_skipped",
        base=FUNCTIONAL,
        file="model.py",
        old='    return linear(_norm(model, "final_norm", x), head)',
        new="    return linear(x, head)",
        mistake="the final norm before the LM head is never applied (its weights are loaded but unused)",
        accepted=("knob:norm_placement",),
    ),
    # ----------------------------------------------------------------------------------------- losses
    SeededBug(
        name="lm_loss_unshifted",
        base=MODULAR,
        file="ops.py",
        old="    return cross_entropy(logits[:, :-1], ids[:, 1:])",
        new="    return cross_entropy(logits, ids)",
        mistake="lm_loss scores each position against its own token instead of the next one",
        accepted=("knob:label_shift",),
    ),
    SeededBug(
        name="train_step_shifts_labels_again",
        base=MODULAR,
        file="training.py",
        old="    optimizer.zero_grad(set_to_none=True)\n    loss = cross_entropy(forward(model, x), y)",
        new="    optimizer.zero_grad(set_to_none=True)\n    loss = cross_entropy(forward(model, x)[:, :-1], y[:, 1:])",
        mistake="train_step shifts the already shifted targets y once more (predicts two tokens ahead)",
        accepted=("knob:label_shift",),
    ),
    SeededBug(
        name="ignored_targets_counted_in_mean",
        base=MODULAR,
        file="ops.py",
        old="    return nll.sum() / keep.sum()",
        new="    return nll.sum() / tgt.numel()",
        mistake="cross_entropy zeroes ignored targets' loss but still divides by the number of all targets",
        accepted=("knob:ignore_index",),
    ),
    SeededBug(
        name="ignore_index_argument_ignored",
        base=FUNCTIONAL,
        file="fn.py",
        old="    counted = targets != ignore_index",
        new="    counted = targets != -100",
        mistake="cross_entropy always ignores -100, whatever ignore_index it is given",
        accepted=("knob:ignore_index",),
    ),
    # ---------------------------------------------------------------------------------------- sampling
    SeededBug(
        name="top_p_on_untempered_distribution",
        base=MODULAR,
        file="sampling.py",
        old="        ordered, order = probs.sort(dim=-1, descending=True)",
        new="        ordered, order = softmax(logits, dim=-1).sort(dim=-1, descending=True)",
        mistake="the nucleus is chosen from softmax of the raw logits, before temperature and top-k",
        accepted=("knob:sampling_order",),
    ),
    SeededBug(
        name="temperature_multiplied",
        base=FUNCTIONAL,
        file="api.py",
        old="    z = logits / temperature",
        new="    z = logits * temperature",
        mistake="logits are multiplied by the temperature instead of divided",
        accepted=("knob:temperature",),
    ),
    SeededBug(
        name="top_k_keeps_k_plus_one",
        base=FUNCTIONAL,
        file="api.py",
        old="        keep[..., top_k:] = False",
        new="        keep[..., top_k + 1 :] = False",
        mistake="top-k keeps the k+1 highest logits",
        accepted=("knob:top_k",),
    ),
    SeededBug(
        name="top_k_larger_than_vocab_crashes",
        base=MODULAR,
        file="sampling.py",
        old="    if top_k is not None and top_k < logits.shape[-1]:",
        new="    if top_k is not None:",
        mistake="top_k > vocab_size is passed to torch.topk, which raises instead of keeping every token",
        accepted=("boundary", "knob:top_k"),
    ),
    SeededBug(
        name="top_p_drops_crossing_token",
        base=MODULAR,
        file="sampling.py",
        old="        n_keep = (running < top_p).sum(dim=-1, keepdim=True) + 1",
        new="        n_keep = (running < top_p).sum(dim=-1, keepdim=True).clamp(min=1)",
        mistake="the nucleus keeps only tokens whose running mass stays below top_p, dropping the one that crosses it",
        accepted=("knob:top_p_boundary",),
    ),
    SeededBug(
        name="top_p_can_remove_every_token",
        base=HALF,
        file="api.py",
        old="        sorted_indices_to_remove[..., -1:] = False  # keep at least one token\n",
        new="",
        mistake="the nucleus filter does not force-keep the top token, so a tiny top_p removes every token (NaN)",
        accepted=("knob:top_p_boundary", "nan_rows"),
    ),
    SeededBug(
        name="sample_ignores_filters",
        base=FUNCTIONAL,
        file="api.py",
        old="    probs = sampling_probs(logits, temperature, top_k, top_p)\n    p_sorted, order",
        new="    probs = sampling_probs(logits, temperature)\n    p_sorted, order",
        mistake="sample draws from the temperature-scaled distribution without the top-k/top-p filters",
        accepted=("knob:sampling_order",),
    ),
    SeededBug(
        name="greedy_sample_consumes_generator",
        base=MODULAR,
        file="sampling.py",
        old="    if temperature == 0:\n        return logits.argmax(dim=-1)\n",
        new="",
        mistake="sample at temperature 0 draws from the one-hot distribution with multinomial, consuming the generator",
        accepted=("knob:temperature",),
    ),
    SeededBug(
        name="sample_flattens_leading_axes",
        base=MODULAR,
        file="sampling.py",
        old="    return drawn.reshape(probs.shape[:-1])",
        new="    return drawn.squeeze(-1)",
        mistake="sample returns ids flattened to [N] instead of logits.shape[:-1]",
        accepted=("shape",),
    ),
    # -------------------------------------------------------------------------------------- generation
    SeededBug(
        name="dropout_on_in_generate",
        base=MODULAR,
        file="api.py",
        old="    model.eval()\n",
        new="",
        mistake="generate does not switch the model to eval mode, so dropout applies while decoding",
        accepted=("knob:mode",),
    ),
    SeededBug(
        name="generate_leaves_training_mode_on",
        base=FUNCTIONAL,
        file="api.py",
        old="        for m, flag in flags:\n            m.training = flag\n    return out\n",
        new="        model.train()\n    return out\n",
        mistake="generate 'restores' the mode with model.train(), leaving an eval-mode model in training mode",
        accepted=("knob:mode",),
    ),
    SeededBug(
        name="attention_dropout_ignores_mode",
        base=FUNCTIONAL,
        file="model.py",
        old='    drop = cfg["dropout"] if model.training else 0.0',
        new='    drop = cfg["dropout"]',
        mistake="attention dropout_p is passed to SDPA whatever the mode, so it applies in eval and generation",
        accepted=("knob:mode",),
    ),
    SeededBug(
        name="window_keeps_first_tokens",
        base=FUNCTIONAL,
        file="api.py",
        old="                    logits = forward(model, out[:, -ctx:])",
        new="                    logits = forward(model, out[:, :ctx])",
        mistake="past the context, generate conditions on the first context_length tokens instead of the last",
        accepted=("knob:window",),
    ),
    SeededBug(
        name="window_one_token_short",
        base=FUNCTIONAL,
        file="api.py",
        old="                    logits = forward(model, out[:, -ctx:])",
        new="                    logits = forward(model, out[:, -(ctx - 1) :])",
        mistake="past the context (and without cache), generate conditions on the last context_length - 1 tokens",
        accepted=("knob:window", "boundary"),
    ),
    SeededBug(
        name="prompt_not_cropped",
        base=MODULAR,
        file="api.py",
        old="                start = max(0, total - ctx)",
        new="                start = 0",
        mistake="generate feeds the whole sequence, never cropping to the last context_length tokens",
        accepted=("knob:window", "boundary"),  # boundary: "raises for a prompt of T tokens, works for fewer"
    ),
    # ---------------------------------------------------------------------------------------- training
    SeededBug(
        name="train_step_without_zero_grad",
        base=MODULAR,
        file="training.py",
        old="    optimizer.zero_grad(set_to_none=True)\n",
        new="",
        mistake="train_step never clears gradients, so each step adds to the previous step's gradients",
        accepted=("knob:zero_grad",),
    ),
    SeededBug(
        name="clip_after_step",
        base=MODULAR,
        file="training.py",
        old=(
            "    if max_grad_norm is not None:\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n"
            "    optimizer.step()\n"
        ),
        new=(
            "    optimizer.step()\n"
            "    if max_grad_norm is not None:\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n"
        ),
        mistake="gradients are clipped after the optimizer step, so the step uses unclipped gradients",
        accepted=("knob:clipping",),
    ),
    SeededBug(
        name="clip_per_parameter",
        base=MODULAR,
        file="training.py",
        old="        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
        new="        for p in model.parameters():\n            torch.nn.utils.clip_grad_norm_(p, max_grad_norm)",
        mistake="gradient clipping limits each parameter's norm separately instead of the global norm",
        accepted=("knob:clipping",),
    ),
    SeededBug(
        name="train_step_in_eval_mode",
        base=FUNCTIONAL,
        file="api.py",
        old="    was_training = model.training\n    model.train()\n",
        new="    was_training = model.training\n",
        mistake="train_step runs the forward pass in whatever mode the model is in (no dropout for an eval model)",
        accepted=("knob:mode",),
    ),
    SeededBug(
        name="get_batch_last_start_unreachable",
        base=MODULAR,
        file="training.py",
        old="    starts = torch.randint(0, n_starts, (batch_size,), generator=generator)",
        new="    starts = torch.randint(0, n_starts - 1, (batch_size,), generator=generator)",
        mistake="get_batch never draws the last window start (and fails with exactly context_length + 1 tokens)",
        accepted=("boundary", "crash"),  # crash (a code added later) names the exactly-enough-data failure
    ),
    SeededBug(
        name="get_batch_targets_not_shifted",
        base=FUNCTIONAL,
        file="api.py",
        old="    return windows[:, :-1].to(device), windows[:, 1:].to(device)",
        new="    return windows[:, :-1].to(device), windows[:, :-1].to(device)",
        mistake="get_batch returns y = x instead of x shifted one token ahead",
        accepted=("knob:label_shift",),
    ),
    SeededBug(
        name="evaluate_mean_of_batch_means",
        base=MODULAR,
        file="training.py",
        old="                total += float(loss) * y.numel()\n                count += y.numel()",
        new="                total += float(loss)\n                count += 1",
        mistake="evaluate averages the per-batch mean losses, so the short last window weighs as much as a full batch",
        accepted=("knob:loss_reduction",),
    ),
    SeededBug(
        name="evaluate_drops_short_last_window",
        base=FUNCTIONAL,
        file="api.py",
        old=(
            "    windows = [(s, min(s + context_length, len(tokens) - 1))"
            " for s in range(0, len(tokens) - 1, context_length)]"
        ),
        new=("    windows = [(s, s + context_length) for s in range(0, len(tokens) - context_length, context_length)]"),
        mistake="evaluate only scores full windows, dropping the shorter last one",
        accepted=("knob:loss_reduction", "boundary"),
    ),
    SeededBug(
        name="evaluate_with_dropout",
        base=FUNCTIONAL,
        file="api.py",
        old="    model.eval()\n",
        new="",
        mistake="evaluate runs in the model's current mode, so a model in training mode applies dropout",
        accepted=("knob:mode",),
    ),
    # ----------------------------------------------------------------------------- init, tying, counts
    SeededBug(
        name="init_without_residual_scaling",
        base=FUNCTIONAL,
        file="model.py",
        old='            t.normal_(0.0, residual_std if kind == "residual" else 0.02)',
        new="            t.normal_(0.0, 0.02)",
        mistake="residual output projections are initialised with std 0.02 instead of 0.02/sqrt(2 n_layers)",
        accepted=("knob:init_std",),
    ),
    SeededBug(
        name="tied_head_detached",
        base=FUNCTIONAL,
        file="model.py",
        old='    head = model.p("tok_embeddings.weight") if cfg["tie_embeddings"] else model.p("lm_head.weight")',
        new=(
            '    head = model.p("tok_embeddings.weight").detach()'
            ' if cfg["tie_embeddings"] else model.p("lm_head.weight")'
        ),
        mistake="the tied LM head uses a detached copy of the embedding, so it gets no gradient from the head",
        accepted=("knob:tying",),
    ),
    SeededBug(
        name="tied_head_shares_data_not_parameter",
        base=HALF,
        file="modeling.py",
        old="            self.lm_head.weight = self.model.embed_tokens.weight",
        new="            self.lm_head.weight.data = self.model.embed_tokens.weight.data",
        mistake="the head shares the embedding's storage but is a second Parameter (own gradient, counted twice)",
        accepted=("knob:tying",),
    ),
    SeededBug(
        name="kv_cache_bytes_without_factor_two",
        base=MODULAR,
        file="api.py",
        old='    return 2 * config["n_layers"] * n_kv * d_head * seq_len * batch_size * element',
        new='    return config["n_layers"] * n_kv * d_head * seq_len * batch_size * element',
        mistake="kv_cache_bytes counts keys only, forgetting the values",
        accepted=("scale",),
    ),
    SeededBug(
        name="kv_cache_bytes_uses_query_heads",
        base=FUNCTIONAL,
        file="api.py",
        old='    kv = cfg.get("n_kv_heads") or cfg["n_heads"]\n    per_token',
        new='    kv = cfg["n_heads"]\n    per_token',
        mistake="kv_cache_bytes sizes the cache by the number of query heads, ignoring GQA",
        accepted=("scale",),
    ),
    SeededBug(
        name="sinusoidal_exponent_i_not_2i",
        base=MODULAR,
        file="ops.py",
        old="    angle = pos / torch.pow(10000.0, two_i / d_model)",
        new="    angle = pos / torch.pow(10000.0, two_i / 2 / d_model)",
        mistake="the sinusoidal table uses 10000**(i/d) instead of 10000**(2i/d)",
        accepted=("knob:rope_base",),
    ),
    SeededBug(
        name="cache_write_out_of_place",
        base=FUNCTIONAL,
        file="model.py",
        old="""        self.keys[layer, :, :, start:stop] = k
        self.values[layer, :, :, start:stop] = v""",
        new="""        self.keys[layer].index_copy(2, torch.arange(start, stop, device=k.device), k)
        self.values[layer].index_copy(2, torch.arange(start, stop, device=v.device), v)""",
        mistake="the cache is written with the out-of-place index_copy and its result dropped: attention reads zeros",
        accepted=("knob:cache_contents",),
    ),
    SeededBug(
        name="cache_layers_stored_reversed",
        base=STUDENT,
        file="model.py",
        old="""            cache.k[layer] = k.detach()
            cache.v[layer] = v.detach()""",
        new="""            cache.k[-1 - layer] = k.detach()
            cache.v[-1 - layer] = v.detach()""",
        mistake="each layer's keys and values are stored in the mirrored layer's entry (the layers' order reversed)",
        accepted=("knob:cache_contents",),
    ),
)


def base_folder(base: str) -> Path:
    return HERE / base


def source_of(bug: SeededBug) -> str:
    return (base_folder(bug.base) / bug.file).read_text()


def materialize(bug: SeededBug, into: Path) -> Path:
    """Copy ``bug.base`` to ``into/<bug.name>`` with the patch applied; return that package folder."""
    text = replace_once(source_of(bug), bug.old, bug.new, f"{bug.name} in {bug.base}/{bug.file}")
    target = Path(into) / bug.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(base_folder(bug.base), target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / bug.file).write_text(text)
    return target


BY_NAME = {bug.name: bug for bug in SEEDED}
