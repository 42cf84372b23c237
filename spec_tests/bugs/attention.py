"""Catalogued mistakes in masks, head sharing, attention, flash attention and multi-head attention.

The model's attention layer is ``multihead_self_attention`` with ``attention="sdpa"``, which calls
``scaled_dot_product_attention(..., fused=True)``: mistakes in the shared code of
``multihead_self_attention`` reach the model too, mistakes in the written-out attention math (what
the suite checks) reach only the components, and ``model_top_left_mask_with_cache`` is in the
fused branch, which only the model uses.
"""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION, MODEL

MHA = "multihead_self_attention"
SDPA = "scaled_dot_product_attention"

BUGS = (
    Bug(
        "cached_path_rotates_values_not_keys",
        "rope_on_values",
        (*CACHE, *GENERATION),
        "attention.py",
        old="        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)",
        new="        turn = dict(style=rope_style, table_size=rope_table_size, scaling=rope_scaling)\n"
        "        if cache is None:\n"
        "            k = rope(k, positions, theta, **turn)\n"
        "        else:  # the bug: the cached path's rotation lands on the value row (llama2.c's per-token loop)\n"
        "            v = rope(v, positions, theta, **turn)",
        explanation="on the cached path RoPE rotates the values instead of the keys (a per-token loop rotating the "
        "wrong cache row): the cache holds unrotated keys and rotated values, while the uncached forward is right",
        fix="rotate the keys (never the values) before they are cached",
        corner=True,
    ),
    Bug(
        "mha_keys_rotated_from_zero",
        "rope",
        (MHA, *MODEL),
        "attention.py",
        old="        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)",
        new="        k = rope(k, torch.arange(k.shape[-2], device=k.device), theta, style=rope_style, "
        "table_size=rope_table_size, scaling=rope_scaling)  # the bug: the keys' RoPE without the positions",
        explanation="the keys are rotated at arange(T) whatever the positions (torchtune's pos_embeddings(k) without "
        "input_pos): the queries turn at their positions, the keys at 0..T-1",
        fix="rotate the keys at the same positions as the queries",
    ),
    # ------------------------------------------------------------------ masks and head sharing
    Bug(
        "attention_output_weight_transposed",
        "layout",
        (MHA, *MODEL),
        "attention.py",
        old="    return linear(merge_heads(out), wo, bo)",
        new="    return linear(merge_heads(out), wo.T, bo)  # the bug: a kernel kept [in, out] used as given",
        explanation="multihead_self_attention applies wo transposed (a [d_model, H*d_head] kernel used as [in, out])",
        fix="multiply the merged heads by wo.T: weights are [out_features, in_features]",
        code="knob:weight_layout",
    ),
    Bug(
        "causal_mask_top_left",
        "causal_mask",
        ("causal_mask", *MODEL),  # the model's fused path uses it when Tq != Tk
        "attention.py",
        old="    q_pos = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)",
        new="    q_pos = torch.arange(t_q, device=device)[:, None]",
        explanation="causal_mask is aligned top-left (torch.tril): with "
        "t_q < t_k the new queries cannot see the newest keys",
        fix="bottom-right alignment: query i may attend key j iff j <= i + (t_k - t_q)",
        corner=True,
    ),
    Bug(
        "repeat_kv_tiled",
        "gqa",
        ("repeat_kv", SDPA, "flash_attention", MHA),
        "attention.py",
        old='    return repeat(x, "... h_kv t d -> ... (h_kv rep) t d", rep=n_rep)',
        new='    return repeat(x, "... h_kv t d -> ... (rep h_kv) t d", rep=n_rep)',
        explanation="kv heads are tiled (x.repeat): query head h reads kv head h % n_kv_heads instead of h // n_rep",
        fix="repeat_interleave along the head axis: x.repeat_interleave(n_rep, dim=-3)",
    ),
    # ------------------------------------------------------------------ scaled_dot_product_attention
    Bug(
        "sdpa_query_heads_grouped_group_major",
        "gqa",
        (SDPA, "flash_attention", MHA),
        "attention.py",
        old="    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)\n    scores =",
        new="    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)\n"
        '    q = rearrange(q, "... (rep h_kv) t d -> ... (h_kv rep) t d", rep=n_rep)  # the bug\n    scores =',
        explanation="the query heads are grouped group-major ((groups, kv heads) where (kv heads, groups) belongs): "
        "query head h attends over kv head h % n_kv_heads and comes back at another head's place",
        fix="query head h attends over kv head h // n_rep and is output head h: reshape q to [..., H_kv, n_rep, T, d]",
        code="knob:gqa_mapping",
    ),
    Bug(
        "attention_missing_scale",
        "attention_scale",
        (SDPA, MHA),
        "attention.py",
        old='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])',
        new='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk")',
        explanation="attention scores are not divided by sqrt(d_head), so the softmax saturates",
        fix="scores = q @ k.transpose(-2, -1) / sqrt(d_head)",
    ),
    Bug(
        "attention_alibi_switched_on",
        "attention_scale",
        (SDPA, MHA),
        "attention.py",
        old="    if softcap is not None:  # protocol v2 (logit_softcap, amendment 25): after the scaling, "
        "before the mask",
        new="    h = q.shape[-3]\n"
        "    slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1, dtype=q.dtype, device=q.device) / h)\n"
        "    i, j = torch.arange(t_q, device=q.device), torch.arange(t_k, device=q.device)\n"
        "    scores = scores - slopes[:, None, None] * (i[:, None] + (t_k - t_q) - j)\n"
        "    if softcap is not None:  # protocol v2 (logit_softcap, amendment 25): after the scaling, "
        "before the mask",
        explanation="ALiBi's distance penalty (-slope_h * (i - j)) is added to the scores of a family that has none "
        "(an alibi flag left on from a shared config)",
        fix="add nothing but the mask to the scaled scores",
        code="knob:score_bias",
    ),
    Bug(
        "attention_scale_sqrt_d_model",
        "attention_scale",
        (SDPA, MHA),
        "attention.py",
        old='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])',
        new='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1] * q.shape[-3])',
        explanation="attention scores are divided by sqrt(d_model) = sqrt(n_heads * d_head) instead of sqrt(d_head)",
        fix="scale by 1/sqrt(d_head), the size of the vectors in each dot product",
    ),
    Bug(
        "attention_scale_written_for_64",
        "attention_scale",
        (SDPA, MHA),
        "attention.py",
        old='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])',
        new='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") * 0.125  # 1/sqrt(64)',
        explanation="attention scores are multiplied by 0.125 = 1/sqrt(64), a head size of 64 written into the code, "
        "whatever d_head is",
        fix="scale by 1/sqrt(d_head), d_head the size of q's last axis",
        code="knob:scale_constant",
    ),
    Bug(
        "sdpa_causal_when_no_mask",
        "causal_mask",
        (SDPA,),
        "attention.py",
        old="""    if causal:
        mask = with_causal(mask, t_q, t_k, q.device)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)""",
        new="""    if causal or mask is None:  # "no mask" read as the usual causal one
        mask = with_causal(mask, t_q, t_k, q.device)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)""",
        explanation="scaled_dot_product_attention applies a causal mask when no mask is given (is_causal=mask is "
        "None), so mask=None hides the future instead of attending every key",
        fix="with mask=None mask nothing; the model asks for causality itself",
        code="knob:mask_missing",
        corner=True,
    ),
    Bug(
        "softmax_over_queries",
        "softmax_dim",
        (SDPA, MHA),
        "attention.py",
        old="    weights = softmax(scores, dim=-1)\n    return einsum(weights, v,",
        new="    weights = softmax(scores, dim=-2)\n    return einsum(weights, v,",
        explanation="attention weights are normalised over the queries (dim -2) instead of over the keys",
        fix="softmax over the last axis (keys): each query's weights sum to 1",
    ),
    Bug(
        "softmax_over_heads",
        "softmax_dim",
        (SDPA, MHA),
        "attention.py",
        old="    weights = softmax(scores, dim=-1)\n    return einsum(weights, v,",
        new="    weights = softmax(scores, dim=1)\n    return einsum(weights, v,",
        explanation="attention weights are normalised over axis 1 of the [B, H, T_q, T_k] scores, the heads (an "
        "exported Softmax node's axis=1), instead of over the keys",
        fix="softmax over the last axis (keys): softmax(scores, dim=-1)",
    ),
    Bug(
        "gqa_mask_of_the_groups_first_head",
        "gqa",
        (SDPA,),
        "attention.py",
        old='    if mask is not None:\n        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))',
        new="    if mask is not None:\n        if n_rep > 1 and mask.ndim >= 3 and mask.shape[-3] > 1:\n"
        "            mask = repeat_kv(mask[..., ::n_rep, :, :], n_rep)\n"
        '        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))',
        explanation="with GQA a per-head mask is read once per kv group: every query head of a group gets the "
        "mask of the group's first head",
        fix="mask the scores of every query head with its own slice of a [..., Hq, Tq, Tk] mask",
    ),
    Bug(
        "mask_transposed",
        "mask_broadcast",
        (SDPA, MHA),
        "attention.py",
        old='        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))',
        new='        scores = scores.masked_fill(~mask.to(torch.bool).transpose(-1, -2), float("-inf"))',
        explanation="the mask is applied transposed: it hides queries "
        "instead of keys (and a causal mask becomes anti-causal)",
        fix="the mask's last axis indexes keys: masked_fill(~mask, -inf) on scores [..., Tq, Tk] as given",
    ),
    Bug(
        "mask_after_softmax",
        "masking",
        (SDPA, MHA),
        "attention.py",
        old="""    if mask is not None:
        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))
    weights = softmax(scores, dim=-1)""",
        new="""    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.to(torch.bool), 0.0)""",
        explanation="masked weights are zeroed after the softmax, so each row no longer sums to 1",
        fix="fill masked scores with -inf before the softmax",
    ),
    # ------------------------------------------------------------------ flash_attention
    Bug(
        "flash_missing_rescale",
        "flash",
        ("flash_attention",),
        "attention.py",
        old='            acc = acc * correction + einsum(p, v_blk, "... h tq tk, ... h tk d -> ... h tq d")',
        new='            acc = acc + einsum(p, v_blk, "... h tq tk, ... h tk d -> ... h tq d")',
        explanation="flash attention rescales the normaliser but not the accumulated output when the running max grows",
        fix="acc = acc * exp(m_old - m_new) + p @ v, like l",
    ),
    Bug(
        "flash_causal_skip_top_left",
        "flash",
        ("flash_attention",),
        "attention.py",
        old="        last_key = q_start + n_q - 1 + offset if causal else t_k - 1",
        new="        last_key = q_start + n_q - 1 if causal else t_k - 1",
        explanation="flash attention skips key blocks as if the causal mask were "
        "top-left, dropping keys the queries may see when t_q < t_k",
        fix="the last key a query block sees is its last query index + (t_k - t_q)",
        corner=True,
    ),
    Bug(
        "flash_skips_by_the_first_query",
        "flash",
        ("flash_attention",),
        "attention.py",
        old="        last_key = q_start + n_q - 1 + offset if causal else t_k - 1",
        new="        last_key = q_start + offset if causal else t_k - 1  # the bug: the block's first query",
        explanation="flash attention skips the key blocks past what the query block's first query may see, so the "
        "block's later queries lose keys the causal mask allows them",
        fix="the last key a query block sees is its last query index + (t_k - t_q)",
        code="knob:flash_block_skip",
    ),
    # ------------------------------------------------------------------ multihead_self_attention
    Bug(
        "gqa_heads_merged_group_minor",
        "gqa",
        (MHA, *MODEL),
        "attention.py",
        old="    return linear(merge_heads(out), wo, bo)",
        new='    out = rearrange(out, "b (g r) t d -> b (r g) t d", g=n_kv_heads)  # the bug: groups merged inner\n'
        "    return linear(merge_heads(out), wo, bo)",
        explanation="the heads' outputs are merged in (query heads per group, kv heads) order: with GQA, wo reads the "
        "heads permuted",
        fix="merge the heads in the order they were split: (kv heads, query heads per group)",
        code="knob:head_layout",
    ),
    Bug(
        "gqa_query_heads_split_group_minor",
        "gqa",
        (MHA, *MODEL),
        "attention.py",
        old="    q = split_heads(linear(x, wq, bq), n_heads)  # [B, H, T, d_head]",
        new='    q = rearrange(linear(x, wq, bq), "b t (r g d) -> b (g r) t d", g=n_kv_heads, r=n_heads // n_kv_heads)'
        "  # the bug",
        explanation="the query heads are split in (query heads per group, kv heads) order, as a fused per-group qkv "
        "weight read with the other grouping: with GQA, each kv group attends with query heads spread apart",
        fix="split the query heads head-major, head h in kv group h // n_rep: (kv heads, query heads per group)",
        code="knob:head_layout",
    ),
    Bug(
        "mha_no_causal_mask",
        "causality",
        (MHA, *MODEL),
        "attention.py",
        old='        out = scaled_dot_product_attention(q, k, v, causal=True, fused=attention == "sdpa")',
        new='        out = scaled_dot_product_attention(q, k, v, fused=attention == "sdpa")',
        explanation="self-attention has no causal mask: every position attends "
        "to the future (logits at t depend on later tokens)",
        fix="mask the upper triangle of the scores with -inf (causal_mask) before the softmax",
    ),
    Bug(
        "mha_causal_only_with_rope",
        "causality",
        (MHA, *MODEL),
        "attention.py",
        old='        out = scaled_dot_product_attention(q, k, v, causal=True, fused=attention == "sdpa")',
        new='        out = scaled_dot_product_attention(q, k, v, causal=theta is not None, fused=attention == "sdpa")',
        explanation="the causal mask is applied only on the RoPE path: attention without theta (GPT-2 style) sees "
        "the future",
        fix="mask the future whether or not q and k are rotated",
    ),
    Bug(
        "mha_without_rope_in_float32",
        "float64_precision",
        (MHA, *MODEL),
        "attention.py",
        old="""    if cache is not None:
        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]""",
        new="""    if theta is None:  # scores in float32, as an "upcast attention" does for half precision
        q, k = q.float().to(x.dtype), k.float().to(x.dtype)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]""",
        explanation="attention without RoPE rounds queries and keys to float32: float64 inputs lose precision",
        fix="compute in the input dtype (upcast 16-bit inputs only)",
    ),
    Bug(
        "mha_rope_on_values",
        "rope_on_values",
        (MHA, *MODEL),
        "attention.py",
        old="        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)\n",
        new="        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)\n"
        "        v = rope(v, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)\n",
        explanation="RoPE is applied to the values as well as the queries and keys",
        fix="rotate q and k only; values carry content, not position",
    ),
    Bug(
        "mha_rope_q_only",
        "rope_q_only",
        (MHA, *MODEL),
        "attention.py",
        old="        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)\n",
        new="",
        explanation="RoPE rotates the queries but not the keys, so scores depend on absolute, not relative, position",
        fix="rotate both q and k with the same positions",
    ),
    Bug(
        "mha_ignores_positions",
        "rope",
        (MHA, *CACHE, *GENERATION, *FORWARD),  # the model passes the positions after the cached tokens
        "attention.py",
        old="""        if positions is None:
            start = 0 if cache is None else cache.length
            positions = torch.arange(start, start + x.shape[1], device=x.device)""",
        new="""        positions = torch.arange(x.shape[1], device=x.device)""",
        explanation="multihead_self_attention always rotates at positions 0..T-1, ignoring "
        "the positions it is given (and with a cache, the cached length)",
        fix="use the given positions; default to arange(T) after the cached tokens only when none are given",
        corner=True,
        code="knob:position_offset",
    ),
    Bug(
        "merge_heads_without_transpose",
        "layout",
        (MHA, *MODEL),
        "attention.py",
        old='    return rearrange(x, "b h t d -> b t (h d)")',
        new="    return x.reshape(x.shape[0], x.shape[2], -1)",
        explanation="heads are merged by reshaping [B, H, T, d] straight "
        "to [B, T, H*d], without moving H next to d first",
        fix="x.transpose(1, 2).contiguous().view(B, T, H * d_head)",
    ),
    Bug(
        "merge_heads_channel_major",
        "layout",
        (MHA, *MODEL),
        "attention.py",
        old='    return rearrange(x, "b h t d -> b t (h d)")',
        new='    return rearrange(x, "b h t d -> b t (d h)")',
        explanation="heads are merged channel-major, '(d h)' instead of '(h d)': wo's columns meet other "
        "(head, channel) entries than they were trained on",
        fix="rearrange(x, 'b h t d -> b t (h d)'): the head outer, the channel inner",
        code="knob:head_layout",
    ),
    Bug(
        "causal_mask_from_the_rope_positions",
        "causal_mask",
        (MHA, *MODEL),
        "attention.py",
        old="    if window is not None:  # protocol v2 (sliding_window): the causal mask narrowed",
        new="""    if cache is None and positions is not None and positions.dim() == 1 and mask is window is None:
        out = scaled_dot_product_attention(q, k, v, positions[None, :] <= positions[:, None])  # the bug
        return linear(merge_heads(out), wo, bo)
    if window is not None:  # protocol v2 (sliding_window): the causal mask narrowed""",
        explanation="multihead_self_attention builds its causal mask from the RoPE positions (key j visible where "
        "positions[j] <= positions[i], Penzai's mask reading the token_positions side input) instead of the order "
        "in the sequence: right for increasing positions, wrong for scattered ones",
        fix="mask by the sequence index, j <= i, whatever the positions",
        corner=True,
        code="knob:mask_alignment",
    ),
    Bug(
        "cached_chunk_mask_laid_new_tokens_first",
        "kv_cache",
        (MHA, *MODEL),
        "attention.py",
        old='        out = scaled_dot_product_attention(q, k, v, causal=True, fused=attention == "sdpa")',
        new="        t_q, t_k, on = q.shape[-2], k.shape[-2], {'dtype': torch.bool, 'device': q.device}\n"
        "        tri = torch.ones(t_q, t_q, **on).tril()  # the bug: the triangle first, the cached columns after it\n"
        "        out = scaled_dot_product_attention(q, k, v, torch.cat([tri, torch.ones(t_q, t_k - t_q, **on)], -1))",
        explanation="a chunk of several new tokens after cached ones gets its causal mask laid out new-tokens-first "
        "(Phi-3's _make_causal_mask appending the past columns after the triangle) while the keys are cached-first",
        fix="mask = cat([ones(T_q, cached), tril(T_q, T_q)], dim=-1): the cached keys' columns first",
        corner=True,
        code="knob:mask_alignment",
    ),
    Bug(
        "keys_rotated_at_the_default_theta",
        "rope_frequency",
        (MHA, *MODEL),
        "attention.py",
        old="        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)",
        new="        k = rope(k, positions, 10000.0, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)",
        explanation="the keys' RoPE turns at the default theta 10000 whatever theta is given (a rotary layer built for "
        "the keys without max_wavelength passed on), the queries' at the given one: right only where theta is 10000",
        fix="rotate queries and keys at the same, given theta",
        corner=True,
        code="knob:rope_theta",
    ),
    Bug(
        "merge_heads_unfolds_the_batch_head_major",
        "layout",
        (MHA, *MODEL),
        "attention.py",
        old='    return rearrange(x, "b h t d -> b t (h d)")',
        new="    b, h = x.shape[0], x.shape[1]  # the bug: (b h) folded, unfolded as (h b)\n"
        '    return rearrange(x.reshape(h, b, *x.shape[2:]), "h b t d -> b t (h d)")',
        explanation="the heads, folded into the batch as [B * H, T, d] (Trax's SplitIntoHeads, index b * H + h), are "
        "unfolded as if indexed h * B + b, so each row's output takes heads of other rows; right for a batch of one",
        fix="rearrange(o, '(b h) t d -> b t (h d)', h=n_heads): unfold in the order the heads were folded",
        corner=True,
        code="knob:head_layout",
    ),
    Bug(
        "split_heads_without_transpose",
        "layout",
        (MHA, *MODEL),
        "attention.py",
        old='    return rearrange(x, "b t (h d) -> b h t d", h=n_heads)',
        new="    return x.reshape(x.shape[0], n_heads, x.shape[1], -1)",
        explanation="heads are split by reshaping [B, T, H*d] straight to [B, H, T, d], mixing time steps into heads",
        fix="x.view(B, T, H, d_head).transpose(1, 2)",
    ),
    # ------------------------------------------------------------------ the fused path (the model's)
    Bug(
        "causal_mask_sized_by_the_queries",
        "causal_mask",
        ("causal_mask", *MODEL),
        "attention.py",
        old="    k_pos = torch.arange(t_k, device=device)[None, :]",
        new="    k_pos = torch.arange(t_q, device=device)[None, :]  # the bug: the keys counted as the queries",
        explanation="causal_mask makes its key axis t_q long (torch.triu(ones(t_q, t_q))), forgetting the keys "
        "cached before the new queries: [t_q, t_q] where [t_q, t_k] belongs",
        fix="make the mask [t_q, t_k]: key j visible to query i iff j <= i + (t_k - t_q)",
    ),
    Bug(
        "model_top_left_mask_with_cache",
        "causal_mask",
        MODEL,
        "attention.py",
        old="        is_causal = causal and mask is None and t_q == t_k",
        new="        is_causal = causal and mask is None and t_q > 1",
        explanation="several new tokens on top of a cache get is_causal=True, "
        "which is top-left aligned: they miss the newest keys",
        fix="is_causal=True only when Tq == Tk; with a cache use a bottom-right mask (j <= i + Tk - Tq)",
        corner=True,
    ),
    Bug(
        "decode_step_misses_its_own_key",
        "causal_mask",
        MODEL,
        "attention.py",
        old="        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]",
        new="""        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]
        if x.shape[1] == 1 and k.shape[-2] > 1:  # the bug: the decode step reads the keys cached before it only
            k, v = k[..., :-1, :], v[..., :-1, :]""",
        explanation="one new token through the cache attends the keys cached before it and not its own (vLLM's "
        "decode metadata read with context_lens for seq_lens)",
        fix="a decoded token attends the cached keys and itself: keys [:cached + 1]",
    ),
    Bug(
        "decode_heads_grouped_the_other_way",
        "gqa",
        MODEL,
        "attention.py",
        old='            grouped = rearrange(q, "... (h_kv rep) 1 d -> ... h_kv rep d", rep=n_rep)',
        new='            grouped = rearrange(q, "... (rep h_kv) 1 d -> ... h_kv rep d", rep=n_rep)',
        explanation="the decode path (one new token, GQA) groups the query heads as [rep, n_kv_heads] instead of "
        "[n_kv_heads, rep]: each output head holds another head's query",
        fix="group the query heads as (h_kv rep): query head h belongs to kv head h // rep",
        corner=True,
    ),
)
