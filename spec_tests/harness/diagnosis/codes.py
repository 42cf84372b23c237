"""The vocabulary of diagnosis causes: every cause a detector reports carries one of these codes.

A code names a family of mistakes, never one test. Structural codes describe how the output differs
(found from the tensors alone); ``knob:`` codes say which single knob of the reference, changed,
reproduces the output; ``known_bug:<name>`` is a catalogued bug whose output the implementation
reproduces. Seeded-bug measurements (``tests/independent``) list the codes that would name each bug
correctly.
"""

from __future__ import annotations

STRUCTURAL = {
    "layout": "the output is a transpose or permutation of the expected one along named axes",
    "scale": "the output is the expected one times a constant or per-row factor",
    "offset": "the output is the expected one plus a constant (everywhere, or per row: unseen by a softmax)",
    "shift": "the output is the expected one shifted by one (or a few) positions along an axis",
    "noop": "the output equals one of the inputs: the operation was not applied",
    "mask": "wrong only on or above the diagonal, or only in masked positions",
    "boundary": "wrong only past some index, or only in the last block, window or chunk",
    "precision": "the error is at the level of float32 rounding: precision, not math",
    "item_order": "a sequence output holds the expected items in another order ((values, keys) for (keys, values))",
    "rope_pairing": "wrong only in one half or in the odd channels: RoPE pairs the wrong channels",
    "nan_rows": "whole rows are NaN: a row with every entry masked",
    "causality": "earlier outputs change when later tokens change: the model sees the future",
    "batch_mixing": "a sequence's output changes with the other sequences of the batch",
    "sign": "the output is the expected one negated (or a rotation the wrong way)",
    "dtype": "the output has the wrong dtype or device",
    "shape": "the output has the wrong shape",
    "overflow": "inf or NaN where the expected value is finite: an intermediate overflowed (exp, squares)",
    "crash": "the call raises for an input the protocol allows, and runs with one property of it changed",
    "cache_fill": "the call raises through a cache that earlier calls filled, and runs through an empty one",
    "crash_head_size": "the call raises for the model's head size and runs for another (a size written into the code)",
    "crash_flag": "the call stops at an assert on a flag or state that is unset on this path (a mode, an init step)",
    "crash_needs_gpu": "the call runs something that needs a GPU (pinned memory, CUDA) on a machine without one",
    "crash_state_dict_keys": "a strict load_state_dict misses keys: buffers registered persistent, weights not filled",
    "crash_meta_value": "the call reads the value of a tensor on the meta device (made on the default device)",
    "crash_zero_divisor": "the call divides by a value that is 0 for an input the protocol allows",
    "outside_blocks": "every block silenced, the model still differs: the embeddings, positions, final norm or head",
    "layer_index": "the first block alone is right and a later one alone is not: something depends on the layer number",
    "between_blocks": "each block alone is right and the stack is not: how one block's output reaches the next",
    "crash_missing_key": "the call reads a key the dict it was given does not hold (an optional or legacy key)",
    "crash_empty_sequence": "the call indexes a list or tuple that is empty for an input the protocol allows",
    "crash_unbound": "the call reads a variable that only some paths assign (UnboundLocalError)",
    "crash_inplace_autograd": "the forward changes in place a tensor autograd saved: every backward through it raises",
    "crash_none_value": "the call reaches an operation on a value that is None for an input the protocol allows",
    "cache_empty": "the call raises through a fresh, empty cache and runs once one token was forwarded into it",
    "crash_state": "the call raises only after earlier calls: a freshly loaded copy of the code runs it (state kept)",
    "partial_update": "one step moves some weights where the specified step does and others elsewhere: those weights' "
    "gradients (their backward pass) or their update",
    "ignored_weight": "the output does not depend on a weight the specified model uses: it is loaded but not used",
    "undetermined": "the model's output depends on the seed it was built under: a parameter left at its random init",
    "tying": "an option's path is right with the head tied one way and wrong with it tied the other",
}

KNOBS = {
    "flash_block_skip": "flash attention skips key blocks by the wrong query's reach (the block's first query)",
    "weight_names": "two weights of one shape loaded into each other's places (a name map that swaps them)",
    "rope_base": "the RoPE exponent uses the wrong base or step (d_model for d_head, i for 2i)",
    "rope_theta": "RoPE uses another theta than the one given",
    "rope_table": "the rotary table turns pairs at position 0 already (cos and sin exchanged, a phase added)",
    "rope_style": "RoPE pairs channels in the other style (interleaved vs half)",
    "rope_scaling": "RoPE scaling (linear, dynamic, llama3, yarn) applied wrongly, twice, or not at all",
    "qkv_bias": "the q, k, v projection biases are missing, misplaced (after RoPE, wrong head split) or on wo too",
    "sliding_window": "the attention window is one key off, ignored, on the wrong layers, or lost on the cached path",
    "qk_norm": "the q/k norms are missing, over d_model instead of each head, after RoPE, on v, or share a weight",
    "logit_softcap": "a soft-cap is missing, applied after the mask or before the scaling, or as cap * tanh(x)",
    "norm_offset": "the RMSNorm gain is the stored weight instead of 1 + weight, on some norms or all",
    "post_norms": "the norms on the sublayers' outputs are missing, after the residual add, or swapped",
    "moe": "the MoE routing is wrong (softmax over the tokens, top-k off by one, weights not renormalised, "
    "experts out of order) or the load-balancing loss is (no n_experts factor, chosen weights for probabilities)",
    "position_offset": "positions start at the wrong offset (do not continue, restart at 0, off by one)",
    "eps_placement": "eps sits outside the square root, or is missing",
    "eps_value": "eps has the wrong value (the argument is ignored)",
    "norm_count": "a norm's statistics are divided by another count than its entries (a block loop's padding counted)",
    "variance_bias": "the variance is the unbiased (n-1) one instead of the biased one",
    "mean_subtraction": "the mean is subtracted where it should not be, or not where it should",
    "norm_weight": "the norm weight is missing, applied twice, or the wrong one is used",
    "scale_constant": "the attention scale is wrong (none, sqrt(d_model), d_head instead of sqrt(d_head))",
    "reduction_dim": "a reduction (softmax, mean, sum) runs over the wrong dimension",
    "gqa_mapping": "query heads read the wrong key/value heads (tiled instead of interleaved)",
    "mask_alignment": "the causal mask is aligned top-left instead of bottom-right, or shifted",
    "mask_polarity": "the mask is inverted (True taken as masked)",
    "activation": "the wrong activation (exact GELU for tanh, SiLU on the wrong branch, gate/up swapped)",
    "sampling_order": "sampling filters applied in the wrong order or on the wrong distribution",
    "top_k": "top-k keeps the wrong number of tokens",
    "top_p_boundary": "the nucleus drops the token that crosses top_p, or keeps one too many",
    "top_p_complement": "the nucleus is cut at 1 - top_p: the threshold of the mass to remove used as the mass to keep",
    "temperature": "the temperature is applied the wrong way (multiplied, applied twice, ignored)",
    "ignore_index": "ignored targets are counted, or the mean is taken over the wrong count",
    "label_shift": "labels are unshifted or shifted twice",
    "loss_reduction": "the loss is summed, or averaged over the wrong count (mean of batch means)",
    "init_std": "initial weights have the wrong standard deviation (no residual scaling)",
    "learning_rate": "the given learning rate is not used (the default, or another one, is)",
    "clipping": "gradient clipping is missing, per-parameter, or applied after the step",
    "tying": "the tied LM head is a copy (or a detached use) of the embedding, not the same parameter",
    "detached": "part of forward is cut from the graph (a detach): some weights get no gradient at all",
    "in_place": "an input is edited in place (scaled, shifted, masked or sorted in the caller's memory)",
    "norm_placement": "a norm is applied after the residual add (post-LN) or skipped",
    "cache_contents": "the KV cache holds the wrong tensors (keys before RoPE, values rotated, another layer's)",
    "cache_slots": "the rows of a batch are written into one another's cache slots (a slot index with the wrong row "
    "stride)",
    "generate_path": "generate computes its first logits otherwise than forward on the prompt, or picks otherwise",
    "evaluate_path": "evaluate scores logits other than those of forward on its windows, or other targets",
    "train_path": "train_step computes its loss otherwise than cross_entropy(forward(model, x), y) of its own forward",
    "cache_feeding": "generate feeds its cache otherwise than the protocol's cached forward takes it (tokens, slots)",
    "lr_schedule": "the learning rate changes from step to step (a decay or warmup schedule) where it is constant",
    "optimizer_state": "the optimizer's state (moments, step count) does not carry over from step to step",
    "update_timing": "an update reaches the model at another time than its step: a step late, or inside a batch",
    "state_carried": "a call keeps state from an earlier call (a metric not reset, a running total or buffer reused)",
    "unstepped_weights": "some of the model's weights are never stepped: left out of the optimizer, or frozen",
    "zero_grad": "gradients of the previous step are not cleared before the next backward pass",
    "window": "the context window is cropped or slid wrongly (first tokens kept, not cropped)",
    "mode": "the module's training mode is wrong during the call or not restored after it",
    "log_of_softmax": "log-probabilities taken as log(softmax(x)): an underflowed probability gives -inf",
    "max_subtraction": "softmax or log-sum-exp without subtracting the max: inf/NaN for large inputs",
    "weight_layout": "a weight is used as [in, out] instead of [out, in] (not transposed, or transposed twice)",
    "bias": "a bias is missing, added twice, or added in the wrong place",
    "mask_missing": "the mask is not applied (ignored, added as 0/1, or masked scores set to 0 instead of -inf)",
    "sinusoid_layout": "sin and cos are swapped, or laid out in halves instead of alternating channels",
    "renormalisation": "the kept probabilities are not renormalised after filtering",
    "head_layout": "heads are split or merged with a plain reshape/view where a transpose is needed",
    "rope_target": "RoPE rotates the wrong tensors (values too, or not both queries and keys)",
    "returned_loss": "train_step returns another loss than the one its step used (recomputed after the step)",
    "top_p_direction": "the nucleus is cut on a sort the other way than its rule assumes: the least likely kept",
    "unsort": "filtered values put back on the wrong token ids (a sort's permutation applied again, not inverted)",
    "draw": "the draw does not pick each kept token with its probability (a race with wrong noise, a second softmax)",
    "generator": "a random draw ignores the given generator (it uses the global RNG) on some path",
    "parameter_groups": "a group of parameters is counted twice or left out (the tied matrix, position embeddings)",
    "missing_residual": "a sublayer's output replaces the residual stream instead of being added to it",
    "parallel_blocks": "attention and the MLP run in parallel on one input (GPT-J) instead of one after the other",
    "embed_scale": "the token embeddings are scaled (by sqrt(d_model)) where the family does not, or not where it does",
    "layer_weights": "every block computes with one block's weights (a repeated module, a loader writing one layer), "
    "or the layers' weights are mixed (a stack over layers split along another axis)",
    "qkv_layout": "q, k, v weights loaded in the wrong order or layout (swapped, rows not head-major, fused per head)",
    "adamw_rule": "AdamW's update rule is wrong (no bias correction, decay coupled or unscaled, eps inside the sqrt)",
    "data_windows": "data is cut into the wrong windows (non-overlapping chunks, windows context_length + 1 apart)",
    "loss_terms": "the loss carries a term the specified one does not have (a z-loss, label smoothing left on)",
    "loss_units": "the loss is reported in another unit (bits: the NLL divided by ln 2) than the natural log's nats",
    "score_bias": "the attention scores get a bias the family does not have (ALiBi's per-head distance penalty)",
    "step_count": "a loop runs one step more or fewer than it is asked for (steps, max_new_tokens)",
}

PREFIX_KNOB = "knob:"
PREFIX_KNOWN = "known_bug:"


def is_valid(code: str) -> bool:
    """True for a structural code, ``knob:<known knob>`` or ``known_bug:<name>``."""
    if code in STRUCTURAL:
        return True
    if code.startswith(PREFIX_KNOB):
        return code[len(PREFIX_KNOB) :] in KNOBS
    return code.startswith(PREFIX_KNOWN) and len(code) > len(PREFIX_KNOWN)
