"""Catalogued mistakes in turning logits into the distribution that is sampled, and drawing from it."""

from __future__ import annotations

from .bug import Bug
from .model_components import GENERATION, SAMPLING

BUGS = (
    Bug(
        "greedy_sample_is_one_based",
        "sampling_order",
        ("sample",),
        "sampling.py",
        old="        return probs.argmax(dim=-1)",
        new="        return probs.argmax(dim=-1) + 1  # the bug: a 1-based token index (Julia's argmax) kept",
        explanation="sample at temperature 0 returns each row's argmax plus 1 (a 1-based language's token index "
        "carried over), so greedy ids are one above the argmax",
        fix="return the 0-based argmax: probs.argmax(dim=-1)",
        code="offset",
    ),
    Bug(
        "sample_folds_its_rows_back_column_major",
        "sampling_order",
        ("sample",),
        "sampling.py",
        old="    return ids.reshape(probs.shape[:-1])",
        new="    lead = probs.shape[:-1]  # the bug: the ids folded back in Julia's column-major order\n"
        "    return ids.reshape(*reversed(lead)).permute(*reversed(range(len(lead))))",
        explanation="sample flattens the rows of [..., V] logits row-major and folds the drawn ids back column-major "
        "(a Julia-order reshape), so with two or more leading axes each row's id lands at another row",
        fix="restore the leading axes in the order they were flattened: ids.reshape(logits.shape[:-1])",
        corner=True,
        code="layout",
    ),
    Bug(
        "top_p_prefilter_cutoff_drops_a_flat_row",
        "top_p",
        SAMPLING,
        "sampling.py",
        old="    drop = drop_sorted.scatter(-1, order, drop_sorted)\n",
        new="    drop = drop_sorted.scatter(-1, order, drop_sorted)\n"
        "    drop |= probs < (1 - p) / (probs.shape[-1] - 1)  # the bug: llama2.c's prefilter\n",
        explanation="top-p first drops every token below (1 - top_p) / (V - 1) (llama2.c's prefilter: such a token "
        "can never be in the nucleus), which on a flat distribution with top_p below 1 / V drops every token",
        fix="keep the top token whatever a prefilter says (or filter by the nucleus alone)",
        corner=True,
    ),
    Bug(
        "top_p_mask_scattered_to_ascending_ids",
        "top_p",
        SAMPLING,
        "sampling.py",
        old="    drop = drop_sorted.scatter(-1, order, drop_sorted)\n",
        new="    drop = drop_sorted.scatter(-1, probs.argsort(dim=-1, stable=True), drop_sorted)  # the bug\n",
        explanation="the top-p mask, made on the probabilities sorted in descending order, is scattered back with the "
        "indices of an ascending argsort (MXNet's is_ascend default): the nucleus's decisions land on the least "
        "probable tokens",
        fix="scatter the mask with the indices of the descending sort it was made in",
    ),
    Bug(
        "sample_one_noise_row_for_the_batch",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="""    ids = torch.multinomial(
        flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat, 1, generator=generator
    )
""",
        new="""    noise = torch.empty_like(flat[:1]).exponential_(1, generator=generator)  # the bug: one row of noise
    ids = (flat / noise).argmax(dim=-1, keepdim=True)  # an exponential race, every row racing the same noise
""",
        explanation="sample draws by an exponential race (probs / q, q ~ Exp(1), as torchtune does) with one row of "
        "noise shared by every row of the batch: rows with the same probabilities always draw the same token",
        fix="draw noise of the probabilities' full shape [B, V] (or torch.multinomial over [B, V])",
        corner=True,
    ),
    Bug(
        "temperature_divides_the_logits_in_place",
        "sampling_order",
        SAMPLING,
        "sampling.py",
        old="    scaled = logits / temperature",
        new="    scaled = logits.div_(temperature)  # the bug: in place, on the caller's logits",
        explanation="sampling_probs divides the caller's logits by the temperature in place: the tensor it was given "
        "comes back scaled",
        fix="scaled = logits / temperature: a new tensor, the input left as it was",
        corner=True,
    ),
    Bug(
        "sampling_probs_flattens_with_view",
        "leading_dims",
        SAMPLING,
        "sampling.py",
        old="    scaled = logits / temperature\n",
        new="    scaled = logits.view(-1, logits.shape[-1]).view(logits.shape) / temperature\n",
        explanation="the logits' leading dims are flattened with .view, which raises on a non-contiguous input whose "
        "leading dims cannot be merged without a copy (a transposed or sliced batch of logits)",
        fix="flatten with reshape (or not at all: the filters work on [..., V])",
    ),
    Bug(
        "sample_multinomial_on_any_rank",
        "leading_dims",
        SAMPLING,
        "sampling.py",
        old='    flat = rearrange(probs, "... v -> (...) v")\n',
        new="    flat = probs  # the bug: torch.multinomial takes 1-D or 2-D probabilities only\n",
        explanation="sample hands torch.multinomial the probabilities as they come, which raises for logits of more "
        "than two dims ([B, T, V]) on the sampling path (temperature > 0)",
        fix='flatten the leading dims first: rearrange(probs, "... v -> (...) v"), then reshape the ids back',
    ),
    Bug(
        "filters_zero_probabilities_unrenormalised",
        "top_k",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    return softmax(scaled, dim=-1)\n",
        new="    return softmax(logits / temperature, dim=-1) * torch.isfinite(scaled)  # the bug: not renormalised\n",
        explanation="the filters zero the probabilities of the whole softmax instead of masking the logits, and "
        "nothing renormalises: each row sums to the mass the filters kept",
        fix="softmax over the filtered logits (or divide by the kept mass)",
        code="knob:renormalisation",
    ),
    Bug(
        "top_p_on_unrenormalised_top_k",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    if top_p is not None:\n        scaled = top_p_filter(scaled, top_p)\n",
        new="    if top_p is not None:  # the bug: top-k's survivors keep the whole softmax's probabilities\n"
        "        probs = softmax(logits / temperature, dim=-1).masked_fill(scaled.isinf(), 0.0)\n"
        "        sorted_probs, order = probs.sort(dim=-1)  # ascending: remove where the cumulative mass <= 1 - top_p\n"
        "        drop_sorted = sorted_probs.cumsum(dim=-1) <= 1 - top_p\n"
        "        drop_sorted[..., -1] = False\n"
        '        scaled = scaled.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))\n',
        explanation="top-p measures the nucleus on top-k's survivors with the whole softmax's probabilities (log-"
        "probabilities not normalised again after top-k), by the ascending rule: the mass top-k removed is missing, "
        "so too few tokens are kept",
        fix="renormalise after top-k (softmax of the filtered logits) before top-p measures the nucleus",
        code="knob:sampling_order",
    ),
    Bug(
        "sample_ignores_transforms",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    probs = sampling_probs(logits, temperature, top_k, top_p)",
        new="    probs = sampling_probs(logits)",
        explanation="sample draws from softmax(logits): temperature, top-k and top-p never reach the distribution "
        "sampled",
        fix="sample from the transformed distribution: scale by 1/temperature, filter top-k and top-p, then softmax "
        "and draw",
    ),
    Bug(
        "top_p_before_temperature",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="        scaled = top_p_filter(scaled, top_p)",
        new='        scaled = scaled.masked_fill(top_p_filter(logits, top_p).isinf(), float("-inf"))',
        explanation="the top-p nucleus is chosen from the untempered distribution softmax(logits), not softmax(logits "
        "/ T)",
        fix="divide by the temperature first, then choose the nucleus of that distribution",
        corner=True,
    ),
    Bug(
        "top_p_before_top_k",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="""    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)""",
        new="""    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)""",
        explanation="the top-p nucleus is chosen from the full distribution before top-k, not from the renormalised "
        "top-k",
        fix="order: temperature, then top-k, then top-p on what top-k kept, then renormalise",
        corner=True,
    ),
    Bug(
        "sampling_softmax_without_max",
        "stability",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    return softmax(scaled, dim=-1)\n",
        new="    weights = scaled.exp()  # -inf logits give 0\n"
        "    return weights / weights.sum(dim=-1, keepdim=True)\n",
        explanation="sampling_probs normalises exp(logits / temperature) without subtracting each row's max: large "
        "logits or a low temperature overflow to inf, and the distribution to NaN",
        fix="subtract each row's max before exp (torch.softmax does)",
        code="knob:max_subtraction",
    ),
    Bug(
        "top_k_fills_zero",
        "top_k",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old='    return logits.masked_fill(logits < kth, float("-inf"))',
        new="    return logits.masked_fill(logits < kth, 0.0)",
        explanation="top-k sets the logits it removes to 0, not -inf: they keep exp(0) weight in the softmax",
        fix='masked_fill(logits < kth, float("-inf"))',
        code="knob:top_k",
    ),
    Bug(
        "generate_keeps_a_default_top_k",
        "sampling_order",
        GENERATION,
        "generation.py",
        old="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)",
        new="            next_id = sample(logits[:, -1], temperature, top_k or 50, top_p, generator)  # the bug",
        explanation="generate keeps a default top-k of 50 where top_k is None (a generation config's default left "
        "in place when the caller passes None): sampling_probs and sample are right, generate never draws the rest",
        fix="pass top_k on as given: None means no top-k filter",
    ),
    Bug(
        "generate_squeezes_a_sampled_row",
        "leading_dims",
        GENERATION,
        "generation.py",
        old="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)",
        new="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)\n"
        "            if temperature > 0:\n"
        "                next_id = next_id.squeeze()  # the bug: a batch of one row becomes a 0-d id",
        explanation="generate squeezes every sampled draw, so a prompt of one row gives a 0-d id and the "
        "concatenation raises (greedy decoding takes another path and runs)",
        fix="keep the batch axis: next_id is [B] whatever B is",
        corner=True,
    ),
    Bug(
        "generate_takes_row_0s_prompt_logits",
        "sampling_order",
        GENERATION,
        "generation.py",
        old="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)",
        new="            last = logits[:, -1]\n"
        "            if ids.shape[1] == prompt.shape[1]:\n"
        "                last = last[:1].expand_as(last)\n"
        "            next_id = sample(last, temperature, top_k, top_p, generator)  # the bug: row 0's prompt logits",
        explanation="generate picks every row's first new token from row 0's last prompt logits (vLLM's index of "
        "each prompt's last token in the flattened batch never advanced); later steps read each row's own",
        fix="row b's first new token is sampled from forward(model, prompt)[b, -1]",
        code="knob:generate_path",
    ),
    Bug(
        "generate_masks_the_prompt_start",
        "sampling_order",
        GENERATION,
        "generation.py",
        old="    ids, cache, mask = prompt, None, None",
        new="    ids, cache, mask = prompt, None, torch.ones_like(prompt).index_fill(1, torch.tensor([0]), 0)",
        explanation="generate hands its model a mask of its own that marks the prompt's first token as padding: "
        "forward is right, and generate's logits are not forward's on the prompt",
        fix="no mask of generate's own: the first token is argmax(forward(model, prompt)[:, -1]) at temperature 0",
        corner=True,
        code="knob:generate_path",
    ),
    Bug(
        "top_k_defaults_to_40",
        "top_k",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="""    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)""",
        new="""    scaled = top_k_filter(scaled, 40 if top_k is None else top_k)  # llama.cpp's default""",
        explanation="a top-k of 40 is applied where top_k is None (llama.cpp's default): with more than 40 tokens "
        "only the 40 most probable keep probability",
        fix="top_k=None keeps every token: filter only when top_k is given",
        code="knob:top_k",
    ),
    Bug(
        "top_k_keeps_first_ids",
        "top_k",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old='    return logits.masked_fill(logits < kth, float("-inf"))',
        new='    return logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= k, float("-inf"))',
        explanation="top-k keeps the first k ids of the vocabulary (as if the logits were sorted), not the k largest "
        "logits",
        fix='kth = logits.topk(k).values[..., -1:]; masked_fill(logits < kth, float("-inf"))',
        code="knob:top_k",
    ),
    Bug(
        "top_k_kth_smallest",
        "top_k",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    kth = logits.topk(k, dim=-1).values[..., -1:]",
        new="    kth = logits.kthvalue(k, dim=-1, keepdim=True).values",
        explanation="top-k's threshold is the k-th smallest logit (kthvalue counts from the smallest), so it keeps "
        "V - k + 1 tokens: every token for top_k=1",
        fix="threshold at the k-th largest logit: logits.topk(k).values[..., -1:]",
        code="knob:top_k",
    ),
    Bug(
        "top_p_cumsum_over_dim_0",
        "top_p",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs\n",
        new="    mass_before = sorted_probs.cumsum(dim=0) - sorted_probs\n",
        explanation="the nucleus's cumulative mass is summed over dim 0: the vocabulary for 1-D logits, the batch "
        "axis for batched ones, so each row's nucleus depends on the rows before it",
        fix="cumsum over the vocabulary, the last axis (dim=-1)",
        code="batch_mixing",
    ),
    Bug(
        "sample_squeezes_a_one_row_batch",
        "leading_dims",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    return ids.reshape(probs.shape[:-1])",
        new="    return ids.squeeze()  # the bug: a batch of one row loses its axis too",
        explanation="sample squeezes multinomial's [N, 1] draws, so logits of one row [1, V] give a 0-d id instead of "
        "[1], and a generate that appends ids[:, None] raises for a batch of one",
        fix="reshape the draws to logits.shape[:-1]: ids.reshape(probs.shape[:-1]) (or squeeze(-1))",
        code="shape",
    ),
    Bug(
        "greedy_divides_by_temperature_zero",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="        return torch.zeros_like(logits).scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)",
        new="        scaled = logits / temperature  # the bug: inf wherever a logit is positive\n"
        "        return torch.zeros_like(logits).scatter(-1, scaled.argmax(dim=-1, keepdim=True), 1.0)",
        explanation="greedy sampling divides the logits by the temperature 0 before its argmax: every positive logit "
        "becomes inf, and the argmax picks the first positive one, not the largest",
        fix="at temperature 0 take the argmax of the logits themselves",
        code="knob:temperature",
    ),
    Bug(
        "top_p_mass_in_vocabulary_order",
        "top_p",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs\n",
        new="    mass_before = probs.cumsum(dim=-1) - probs\n",
        explanation="the nucleus's cumulative mass is summed over the probabilities in vocabulary order, and the cut "
        "laid on the sorted order: how many tokens are kept depends on the token ids, not on the sorted mass",
        fix="cumsum the sorted probabilities: sorted_probs.cumsum(dim=-1) - sorted_probs",
        code="knob:sampling_order",
    ),
    Bug(
        "top_p_drops_crossing_token",
        "top_p",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs\n"
        "    drop_sorted = mass_before >= p - 16 * torch.finfo(probs.dtype).eps\n"
        "    drop_sorted[..., 0] = False  # the top token always stays, however small p (even below the allowance)\n",
        new="    mass_before = sorted_probs.cumsum(dim=-1)\n"
        "    drop_sorted = mass_before >= p - 16 * torch.finfo(probs.dtype).eps\n",
        explanation="top-p drops the token whose probability makes the mass cross top_p (and everything, when the top "
        "token alone reaches it)",
        fix="drop a token only when the mass of the tokens ranked above it already reaches top_p (shift the cumsum by "
        "one)",
        corner=True,
    ),
    Bug(
        "top_k_off_by_one",
        "top_k",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    kth = logits.topk(k, dim=-1).values[..., -1:]",
        new="    kth = logits.sort(dim=-1, descending=True).values[..., k : k + 1]",
        explanation="top-k keeps k + 1 tokens: the threshold is sorted[k] (0-based), the (k+1)-th largest logit",
        fix="the threshold is the k-th largest logit, sorted[k - 1] (or topk(k).values[..., -1])",
        corner=True,
    ),
    Bug(
        "temperature_multiplies",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    scaled = logits / temperature",
        new="    scaled = logits * temperature",
        explanation="logits are multiplied by the temperature, so a low temperature flattens the distribution instead "
        "of sharpening it",
        fix="divide the logits by the temperature",
        code="knob:temperature",
    ),
    Bug(
        "sample_race_with_uniform_noise",
        "sampling_order",
        SAMPLING,
        "sampling.py",
        old="""    ids = torch.multinomial(
        flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat, 1, generator=generator
    )""",
        new="""    noise = torch.empty_like(flat).uniform_(generator=generator)  # a race with uniform noise
    ids = (flat / noise).argmax(dim=-1, keepdim=True)""",
        explanation="sample runs the exponential race argmax(p / q) with q uniform instead of Exponential(1), so token "
        "i is not drawn with probability p_i",
        fix="q = torch.empty_like(p).exponential_(1) (or torch.multinomial(p))",
        corner=True,
        code="knob:draw",
    ),
    Bug(
        "top_p_unsorted_with_gather",
        "top_p",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="""    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))""",
        new="""    sorted_logits = logits.gather(-1, order).masked_fill(drop_sorted, float("-inf"))
    return sorted_logits.gather(-1, order)  # back to vocabulary order""",
        explanation="top-p filters the logits in sorted order and puts them back with the sort's permutation again "
        "(gather) instead of its inverse (scatter), so the kept values land on other token ids",
        fix="sorted_logits.scatter(-1, order, sorted_logits) (or mask in vocabulary order)",
        corner=True,
        code="knob:unsort",
    ),
    Bug(
        "top_p_mask_put_back_with_gather",
        "top_p",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    drop = drop_sorted.scatter(-1, order, drop_sorted)",
        new="    drop = drop_sorted.gather(-1, order)  # back to vocabulary order",
        explanation="top-p makes its drop mask in sorted order and puts it back with the sort's permutation again "
        "(gather) instead of its inverse (scatter), so the mask drops other tokens than those outside the nucleus",
        fix="drop_sorted.scatter(-1, order, drop_sorted)",
        code="knob:unsort",
    ),
    Bug(
        "top_p_sorted_ascending",
        "top_p",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="    sorted_probs, order = probs.sort(dim=-1, descending=True)",
        new="    sorted_probs, order = probs.sort(dim=-1)",
        explanation="top-p accumulates the probabilities sorted ascending, so the nucleus keeps the least likely "
        "tokens whose mass reaches top_p",
        fix="sort descending: the nucleus is the smallest set of the most probable tokens",
        code="knob:top_p_direction",
    ),
    Bug(
        "sample_softmax_of_probabilities",
        "sampling_order",
        (*SAMPLING, *GENERATION),
        "sampling.py",
        old="""    ids = torch.multinomial(
        flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat, 1, generator=generator
    )""",
        new="""    ids = torch.multinomial(  # a categorical that takes logits, given the probabilities
        torch.softmax(flat.double(), dim=-1), 1, generator=generator
    )""",
        explanation="sample draws from softmax of sampling_probs' probabilities, as a categorical that takes "
        "logits given probabilities does: filtered tokens (probability 0) are drawn too",
        fix="draw from the probabilities themselves: torch.multinomial(probs)",
        corner=True,
        code="knob:draw",
    ),
)
