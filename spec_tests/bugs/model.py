"""Catalogued mistakes in the model, its configuration, the KV cache and generation."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, EVALUATION, FORWARD, GENERATION, INIT, MODEL, TRAINING

# the KV cache's write of one call's keys and values in reference/kv_cache.py (the text two cache bugs replace)
CACHE_WRITE = (
    "        self.key_buffers[layer][..., start:end, :] = k\n        self.value_buffers[layer][..., start:end, :] = v"
)


def full_cache_cut(kept: str, what: str) -> str:
    """generate's cached branch with a full cache cut to the positions ``kept`` (a slice's text) in every layer and
    decoding going on from it, instead of a fresh cache fed the window (the text two generation bugs put in)."""
    return f"""            if cache is not None and ids.shape[1] > ctx and mask is None:  # the bug: {what}
                held = [cache.kv(layer) for layer in range(len(cache.lengths))]
                cache = new_cache(model, ids.shape[0])
                for layer, (k, v) in enumerate(held):
                    cache.update(layer, k[..., {kept}, :], v[..., {kept}, :])
                logits = model(ids[:, -1:], cache)
            elif cache is not None and ids.shape[1] <= ctx:
"""


BUGS = (
    # ------------------------------------------------------------------ the block and the model
    Bug(
        "post_ln",
        "norm_placement",
        MODEL,
        "model.py",
        old="""        x = x + self.drop(self.attn(self.attn_norm(x), positions, cache, layer, mask))
        return x + self.drop(self.mlp(self.mlp_norm(x)))""",
        new="""        x = self.attn_norm(x + self.drop(self.attn(x, positions, cache, layer, mask)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))""",
        explanation="the block is post-LN, norm(x + f(x)), instead of pre-LN, x + f(norm(x))",
        fix="x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x)): normalise the sublayer input, not the residual",
    ),
    Bug(
        "missing_final_norm",
        "norm_placement",
        MODEL,
        "model.py",
        old="        return linear(self.final_norm(x), self.lm_head.weight)",
        new="        return linear(x, self.lm_head.weight)",
        explanation="the LM head reads the residual stream without the final norm",
        fix="logits = lm_head(final_norm(x))",
    ),
    Bug(
        "mlp_residual_missing",
        "wiring",
        FORWARD,
        "model.py",
        old="        return x + self.drop(self.mlp(self.mlp_norm(x)))",
        new="        return self.drop(self.mlp(self.mlp_norm(x)))",
        explanation="the MLP's output replaces the residual stream instead of being added to it",
        fix="return x + mlp(mlp_norm(x)): each sublayer adds to the stream it read",
        code="knob:missing_residual",
    ),
    Bug(
        "parallel_attention_and_mlp",
        "wiring",
        FORWARD,
        "model.py",
        old="""        x = x + self.drop(self.attn(self.attn_norm(x), positions, cache, layer, mask))
        return x + self.drop(self.mlp(self.mlp_norm(x)))""",
        new="""        h = self.drop(self.attn(self.attn_norm(x), positions, cache, layer, mask))
        return x + h + self.drop(self.mlp(self.mlp_norm(x)))""",
        explanation="attention and the MLP both read the block's input (GPT-J's parallel block), "
        "so the MLP never sees the attention's output",
        fix="x = x + attn(attn_norm(x)); then x = x + mlp(mlp_norm(x)) on the updated x",
        code="knob:parallel_blocks",
    ),
    Bug(
        "embedding_scaled_by_sqrt_d_model",
        "wiring",
        FORWARD,
        "model.py",
        old="        x = embedding(ids, self.tok_embeddings.weight)  # [B, T, d_model]",
        new="        x = embedding(ids, self.tok_embeddings.weight) * math.sqrt(self.config.d_model)",
        explanation="the token embeddings are multiplied by sqrt(d_model) (as in the original Transformer), "
        "which llama and gpt2 do not do",
        fix="use the embedding rows as they are (only embed_scale, Gemma's, scales them)",
        code="knob:embed_scale",
    ),
    Bug(
        "model_attention_scale_rooted_twice",
        "wiring",
        FORWARD,
        "model.py",
        old="""            self.wq.weight,
            self.wk.weight,
            self.wv.weight,
            self.wo.weight,
            cfg.n_heads,
            cfg.kv_heads,
            self.theta,
            positions,
            bq=self.wq.bias,""",
        new="""            self.wq.weight * cfg.d_head**0.25,
            self.wk.weight,
            self.wv.weight,
            self.wo.weight,
            cfg.n_heads,
            cfg.kv_heads,
            self.theta,
            positions,
            bq=None if self.wq.bias is None else self.wq.bias * cfg.d_head**0.25,""",
        explanation="the model's attention scales the scores by d_head ** -0.25 (a norm factor of its own, "
        "sqrt(sqrt(d_head)), on q before the attention's 1/sqrt(d_head)); the attention functions are right",
        fix="scale q k^T by 1/sqrt(d_head) once, inside the attention",
        code="knob:scale_constant",
    ),
    Bug(
        "wo_transposed_at_load",
        "wiring",
        FORWARD,
        "model.py",
        old="        params[name].copy_(value)",
        new="        params[name].copy_(value.t() if name.endswith('attn.wo.weight') else value)",
        explanation="the square output projection wo is transposed when loaded (read as [in, out])",
        fix="canonical weights are [out_features, in_features], as nn.Linear holds them: copy them as they are",
        corner=True,
        code="knob:weight_layout",
    ),
    Bug(
        "every_layer_runs_the_last_block",
        "wiring",
        FORWARD,
        "model.py",
        old="            x = block(x, positions, cache, layer, mask)",
        new="            x = self.layers[-1](x, positions, cache, layer, mask)",
        explanation="the layer loop calls the last block at every layer (a block variable left over from another "
        "loop), so every layer computes with the last layer's weights",
        fix="call each layer's own block: for layer, block in enumerate(self.layers): x = block(x, ...)",
        corner=True,
        code="knob:layer_weights",
    ),
    Bug(
        "build_model_keeps_the_given_tensors",
        "weight_copies",
        (*MODEL, *TRAINING),
        "model.py",
        old="        params[name].copy_(value)",
        new="        params[name].data = value  # the bug: the caller's tensor kept as the parameter's memory",
        explanation="build_model keeps the given tensors as its parameters' memory (load_state_dict(assign=True)), "
        "so every update of the model writes into the caller's state dict",
        fix="copy the values in: param.copy_(value), or load_state_dict without assign",
        code="knob:in_place",
    ),
    Bug(
        "one_norm_module_for_both_branches",
        "wiring",
        (*FORWARD, *MODEL),
        "model.py",
        old="""        params[name].copy_(value)


def canonical_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    \"\"\"The weights under canonical names (``lm_head.weight`` only when untied).\"\"\"
    return {name: p.detach() for name, p in model.named_parameters()}""",
        new="""        params[name].copy_(value)
    for block in model.layers:  # the bug: one norm module for both branches, the MLP's (loaded last)
        block.attn_norm = block.mlp_norm


def canonical_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    \"\"\"The weights under canonical names (``lm_head.weight`` only when untied).\"\"\"
    tied = model.lm_head.weight is model.tok_embeddings.weight
    named = model.named_parameters(remove_duplicate=False)
    return {name: p.detach() for name, p in named if not (tied and name == "lm_head.weight")}""",
        explanation="each block uses one norm module for both branches (the attention's norm is the MLP's), so "
        "attn_norm's weight is shared with mlp_norm's and loading one writes over the other",
        fix="give each branch its own norm: attn_norm and mlp_norm are two modules",
        code="knob:layer_weights",
    ),
    Bug(
        "layers_stacked_and_reshaped_at_load",
        "wiring",
        FORWARD,
        "model.py",
        old="""    for name, value in state_dict.items():
        if tuple(value.shape) != tuple(params[name].shape):""",
        new="""    groups = {}  # the bug: each weight stacked over the layers, read back with the layers on dim 1
    for name in state_dict:
        if name.startswith("layers."):
            groups.setdefault(name.split(".", 2)[2], []).append(name)
    state_dict = dict(state_dict)
    for names in groups.values():
        stack = torch.stack([state_dict[n] for n in names])
        mixed = stack.reshape(stack.shape[1], len(names), *stack.shape[2:])
        state_dict.update({n: mixed[:, i] for i, n in enumerate(names)})
    for name, value in state_dict.items():
        if tuple(value.shape) != tuple(params[name].shape):""",
        explanation="the per-layer weights are stacked for a scan over layers and split back with a reshape where a "
        "moveaxis belongs: each layer is loaded with rows of its neighbours' weights",
        fix="stack the layers on their own axis and index that axis to split them (torch.stack(ws, dim=axis))",
        code="knob:layer_weights",
    ),
    Bug(
        "wq_wk_swapped_at_load",
        "wiring",
        FORWARD,
        "model.py",
        old="""    for name, value in state_dict.items():
        if tuple(value.shape) != tuple(params[name].shape):""",
        new="""    swap = {".wq.": ".wk.", ".wk.": ".wq."}
    state_dict = {
        next((name.replace(a, b) for a, b in swap.items() if a in name), name): value
        for name, value in state_dict.items()
    }
    for name, value in state_dict.items():
        if tuple(value.shape) != tuple(params[name].shape):""",
        explanation="the query and key projections are swapped when loaded (attn.wq goes to the keys); "
        "with grouped keys their shapes differ and loading fails",
        fix="load attn.wq.weight into the query projection and attn.wk.weight into the key projection",
        code="knob:qkv_layout",
    ),
    Bug(
        "tied_weights_copied",
        "tied_weights",
        MODEL,
        "model.py",
        old="            self.lm_head.weight = self.tok_embeddings.weight  # one parameter, two uses",
        new="            self.lm_head.weight = nn.Parameter(self.tok_embeddings.weight.detach().clone())",
        explanation="the LM head gets a copy of the embedding matrix, "
        "not the same parameter: two tensors that drift apart",
        fix="assign the same parameter: lm_head.weight = tok_embeddings.weight",
    ),
    Bug(
        "tied_head_detached",
        "tied_weights",
        (*MODEL, *TRAINING),
        "model.py",
        old="        return linear(self.final_norm(x), self.lm_head.weight)",
        new="        return linear(self.final_norm(x), self.lm_head.weight.detach())",
        explanation="the LM head uses its weight detached: the same values, but no gradient from the head reaches it "
        "(a tied matrix learns from its lookup alone, an untied head not at all)",
        fix="use the weight as it is: linear(x, lm_head.weight)",
        code="knob:tying",
    ),
    Bug(
        "fresh_head_allocated_in_out",
        "init",
        (*MODEL, *INIT),
        "model.py",
        old="""        else:
            p.normal_(0.0, 0.02)
    for module in model.modules():""",
        new="""        elif name == "lm_head.weight":  # allocated [in, out], as a matmul x @ w would want it
            p.data = p.new_empty(p.shape[::-1]).normal_(0.0, 0.02)
        else:
            p.normal_(0.0, 0.02)
    for module in model.modules():""",
        explanation="a freshly initialised untied head is allocated [d_model, V] ([in, out]) instead of nn.Linear's "
        "[V, d_model]: a model built without a state_dict cannot run forward (one built from weights can)",
        fix="initialise the head in place in its own shape: lm_head.weight.normal_(0.0, 0.02)",
        code="shape",
    ),
    Bug(
        "untied_gpt2_head_loaded_from_embedding",
        "tied_weights",
        MODEL,
        "model.py",
        old="""        params[name].copy_(value)
""",
        new="""        params[name].copy_(value)
    if model.config.family == "gpt2" and "lm_head.weight" in params:  # GPT-2 checkpoints tie their head
        params["lm_head.weight"].copy_(params["tok_embeddings.weight"])
""",
        explanation="an untied gpt2 model's head is overwritten with the embedding matrix when loaded (a loader that "
        "assumes GPT-2's tying whatever the config says), so lm_head.weight is ignored",
        fix="load lm_head.weight as given when tie_embeddings is False; tie only when it is True",
    ),
    Bug(
        "kv_cache_bytes_in_bits",
        "memory",
        MODEL,
        "kv_cache.py",
        old="    element_size = torch.empty((), dtype=dtype).element_size()",
        new="    element_size = torch.finfo(dtype).bits  # the dtype's size",
        explanation="kv_cache_bytes counts each element's size in bits, so the total is 8 times the bytes",
        fix="element_size() is in bytes: torch.empty((), dtype=dtype).element_size()",
        code="scale",
    ),
    Bug(
        "count_parameters_counts_tied_twice",
        "tied_weights",
        FORWARD,
        "model.py",
        old="    return sum(p.numel() for p in model.parameters())",
        new="    return sum(p.numel() for p in model.state_dict().values())",
        explanation="count_parameters sums the state dict, which lists a tied matrix under both names",
        fix="count unique parameters: sum(p.numel() for p in model.parameters())",
        corner=True,
    ),
    Bug(
        "missing_residual_init_scaling",
        "init",
        INIT,
        "model.py",
        old="    residual_std = 0.02 / math.sqrt(2 * model.config.n_layers)",
        new="    residual_std = 0.02",
        explanation="residual output projections (wo, w_down, w_proj) are "
        "initialised with std 0.02, not 0.02/sqrt(2 n_layers)",
        fix="scale the residual projections' std by 1/sqrt(2 * n_layers)",
        corner=True,
    ),
    Bug(
        "residual_init_scales_the_attention_output_only",
        "init",
        INIT,
        "model.py",
        old="        if name.endswith(RESIDUAL_PROJECTIONS):\n            p.normal_(0.0, residual_std)",
        new="        if name.endswith('attn.wo.weight'):  # the bug: GPT-2's c_proj rule carried over to one name\n"
        "            p.normal_(0.0, residual_std)",
        explanation="only the attention's output projection wo is initialised with std 0.02/sqrt(2 n_layers); the "
        "MLP's output projection (w_down, w_proj) keeps 0.02 (GPT-2's c_proj rule carried over to one name)",
        fix="scale every projection that writes to the residual stream: wo, w_down and w_proj",
        corner=True,
    ),
    Bug(
        "init_reuses_one_seed",
        "init",
        INIT,
        "model.py",
        old="""        else:
            p.normal_(0.0, 0.02)""",
        new="""        else:  # the bug: a generator seeded anew for each weight (a PRNG key reused)
            p.normal_(0.0, 0.02, generator=torch.Generator(p.device).manual_seed(0))""",
        explanation="every fresh weight is drawn from a generator seeded anew, so weights of one shape are equal (wq "
        "in every layer, w_gate and w_up), each with the right mean and std",
        fix="draw every weight from one advancing generator",
    ),
    Bug(
        "residual_init_scaled_by_layer_depth",
        "init",
        INIT,
        "model.py",
        old="        if name.endswith(RESIDUAL_PROJECTIONS):\n            p.normal_(0.0, residual_std)",
        new="        if name.endswith(RESIDUAL_PROJECTIONS):  # the bug: the layer's depth\n"
        "            p.normal_(0.0, 0.02 / math.sqrt(2 * (int(name.split('.')[1]) + 1)))",
        explanation="each layer's residual projections are initialised with std 0.02/sqrt(2 (layer + 1)), scaled by "
        "the layer's own depth, instead of 0.02/sqrt(2 n_layers) in every layer",
        fix="one residual std for the model: 0.02/sqrt(2 * n_layers) in every layer",
        corner=True,
    ),
    Bug(
        "keys_detached_from_the_graph",
        "tied_weights",
        (*FORWARD, *TRAINING),
        "attention.py",
        old="    if cache is not None:\n        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]",
        new="    k = k.detach()  # the bug: the keys as a cache keeps them, cut from the graph, used by this call too\n"
        "    if cache is not None:\n        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]",
        explanation="attention uses its keys detached (the copy a cache stores, handed back to this call): no "
        "gradient reaches wk, and every other derivative through the keys is lost with it",
        fix="use the keys as computed; detach only what is kept for later calls",
        corner=True,
    ),
    Bug(
        "weights_rounded_to_float32_at_load",
        "float64_precision",
        (*FORWARD,),
        "model.py",
        old="        params[name].copy_(value)",
        new="        params[name].copy_(value.float())  # the bug: a float32 detour (as a checkpoint converter writes)",
        explanation="loading rounds every given weight to float32 on its way into the model: a float64 model holds "
        "and gives back float32 values",
        fix="copy each weight as given (params[name].copy_(value)), in the model's own dtype",
        corner=True,
    ),
    Bug(
        "gpt2_export_splits_fused_qkv_in_thirds",
        "layout",
        FORWARD,
        "model.py",
        old="    return {name: p.detach() for name, p in model.named_parameters()}",
        new="""    sd = {name: p.detach() for name, p in model.named_parameters()}
    if model.config.family == "gpt2":  # the bug: exported through GPT-2's fused c_attn, split in equal thirds
        for i in range(len(model.layers)):
            for kind in ("weight", "bias"):
                names = [f"layers.{i}.attn.w{x}.{kind}" for x in "qkv"]
                if all(n in sd for n in names):
                    sd.update(zip(names, torch.cat([sd[n] for n in names]).chunk(3)))
    return sd""",
        explanation="canonical_state_dict of a gpt2 model goes through a fused qkv matrix split in equal thirds, "
        "which holds with as many kv heads as query heads only: with GQA, wq takes some of wk's rows",
        fix="split the fused matrix at d_model and d_model + n_kv_heads * d_head (torch.split with those sizes)",
        corner=True,
    ),
    Bug(
        "d_model_not_divisible_accepted",
        "validation",
        FORWARD,
        "config.py",
        old="""    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
""",
        new="",
        explanation="a d_model not divisible by n_heads is accepted and d_head silently rounds down",
        fix="raise ValueError naming d_model and n_heads when d_model % n_heads != 0",
        corner=True,
    ),
    # ------------------------------------------------------------------ the KV cache
    Bug(
        "forward_flattens_ids_with_view",
        "layout",
        (*FORWARD, *CACHE, *GENERATION, *TRAINING, *EVALUATION),
        "model.py",
        old="        x = embedding(ids, self.tok_embeddings.weight)  # [B, T, d_model]",
        new="        x = embedding(ids.view(-1), self.tok_embeddings.weight).view(*ids.shape, -1)  # B*T ids at once",
        explanation="forward flattens the ids with .view, which raises on non-contiguous ids (a slice such as a "
        "cached run's chunk ids[:, t:t + n], or generate's window)",
        fix="ids.reshape(-1), or embed the [B, T] ids as they are",
        code="crash",
    ),
    Bug(
        "new_cache_hands_back_the_last_one",
        "cache_positions",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="    p = next(model.parameters())\n    return KVCache(model.config, batch_size, p.device, p.dtype)\n",
        new="    p = next(model.parameters())\n"
        "    key = (repr(model.config), batch_size, p.device, p.dtype)  # a workspace per shape, allocated once\n"
        "    if key not in _WORKSPACES:\n"
        "        _WORKSPACES[key] = KVCache(model.config, batch_size, p.device, p.dtype)\n"
        "    return _WORKSPACES[key]\n\n\n"
        "_WORKSPACES = {}\n",
        explanation="new_cache hands back the cache it made before for the same config and batch size, never reset: a "
        "new cache starts with the positions earlier ones wrote",
        fix="a new KVCache for every new_cache call, empty",
    ),
    Bug(
        "final_norm_without_the_last_residual",
        "norm_placement",
        MODEL,
        "model.py",
        old="            x = block(x, positions, cache, layer, mask)",
        new="            if layer == len(self.layers) - 1 and not block.post_norms:  # the bug\n"
        "                h = x + block.drop(block.attn(block.attn_norm(x), positions, cache, layer, mask))\n"
        "                x = block.drop(block.mlp(block.mlp_norm(h)))\n"
        "            else:\n"
        "                x = block(x, positions, cache, layer, mask)",
        explanation="the final norm reads the last block's MLP output alone: the residual stream is not added back "
        "after the last layer (a fused add-and-norm called without its residual at the end)",
        fix="final_norm(x + mlp(mlp_norm(x))): the whole stream the last block returns",
        code="knob:missing_residual",
    ),
    Bug(
        "position_embeddings_scaled_down",
        "wiring",
        MODEL,
        "model.py",
        old="            x = x + embedding(positions, self.pos_embeddings.weight)",
        new="            x = x + embedding(positions, self.pos_embeddings.weight) * self.config.d_model**-0.5",
        explanation="gpt2's learned position embeddings are scaled by d_model ** -0.5 before they are added "
        "(x-transformers' AbsolutePositionalEmbedding)",
        fix="add the position embeddings as they are: x = tok_embeddings(ids) + pos_embeddings(positions)",
        code="knob:embed_scale",
    ),
    Bug(
        "loader_skips_the_value_projection",
        "wiring",
        MODEL,
        "model.py",
        old="        params[name].copy_(value)",
        new='        if not name.endswith("attn.wv.weight"):  # the bug: a name map without the value projection\n'
        "            params[name].copy_(value)",
        explanation="the loader never copies attn.wv.weight: every layer's value projection keeps its random "
        "initialisation, so the model depends on the global random state it was built under",
        fix="copy every given weight into its parameter (a name map with an entry for each canonical name)",
    ),
    Bug(
        "loader_swaps_the_block_norms",
        "wiring",
        MODEL,
        "model.py",
        old="        params[name].copy_(value)",
        new="        swapped = {'attn_norm': 'mlp_norm', 'mlp_norm': 'attn_norm'}  # the bug: two names swapped\n"
        "        parts = name.split('.')\n"
        "        params['.'.join(swapped.get(p, p) for p in parts)].copy_(value)",
        explanation="the loader's name map exchanges attn_norm and mlp_norm: each block normalises its attention "
        "input with the MLP norm's weights and the reverse",
        fix="load each canonical weight under its own name",
        code="knob:weight_names",
    ),
    Bug(
        "final_norm_default_eps",
        "wiring",
        MODEL,
        "model.py",
        old="        self.final_norm = Norm(cfg.d_model, cfg.norm_eps)",
        new="        self.final_norm = Norm(cfg.d_model, 1e-5)  # the bug: the library's default eps",
        explanation="the final norm is built with eps 1e-5 whatever the config's norm_eps (the blocks' norms take it)",
        fix="Norm(cfg.d_model, cfg.norm_eps) for the final norm too",
        code="knob:eps_value",
    ),
    Bug(
        "cache_kv_reads_the_layer_before",
        "kv_cache",
        CACHE,
        "kv_cache.py",
        old="    return cache.kv(layer)\n",
        new="    if layer == 0:  # the bug: layers numbered from 1 (layer_number = i + 1) where the entries are kept\n"
        "        return None, None\n"
        "    return cache.kv(layer - 1)\n",
        explanation="cache_kv reads the entry of layer - 1 (a 1-based layer number on the reading side only): layer 0 "
        "gives nothing and layer i the keys and values of layer i - 1",
        fix="return cache.kv(layer): the entry layer's own attention writes",
        code="knob:cache_contents",
    ),
    Bug(
        "cache_length_set_not_advanced",
        "cache_positions",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="        self.lengths[layer] = end\n",
        new="        self.lengths[layer] = k.shape[-2]\n",
        explanation="the cached length is set to the new call's length instead of advanced by it: later calls read "
        "and write the wrong positions",
        fix="length += the new tokens' count (end = start + T_new)",
    ),
    Bug(
        "cache_length_advanced_by_one",
        "cache_positions",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="        self.lengths[layer] = end\n",
        new="        self.lengths[layer] = start + 1  # one position per call: written for decoding\n",
        explanation="the cached length is advanced by one per call instead of by the call's number of tokens: a "
        "multi-token call leaves it short and the next call writes over its positions",
        fix="length += the new tokens' count (end = start + T_new)",
    ),
    Bug(
        "cache_positions_restart",
        "cache_positions",
        (*CACHE, *GENERATION, *FORWARD),
        "model.py",
        old="        start = 0 if cache is None else cache.length",
        new="        start = 0",
        explanation="positions restart at 0 for every call with a cache instead of continuing from the cached length",
        fix="new tokens sit at positions cache.length, cache.length + 1 and onwards",
    ),
    Bug(
        "generate_keeps_its_cache_between_calls",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="                cache = new_cache(model, ids.shape[0]) if use_cache else None",
        new="                fresh = new_cache(model, ids.shape[0])\n"
        '                cache = model.__dict__.setdefault("_kept_cache", fresh) if use_cache else None',
        explanation="generate keeps its cache on the model and starts the next call from it (the earlier call's keys "
        "and positions still in it) instead of a fresh cache",
        fix="start every generate (and every slide past the context) from a new cache",
        code="knob:state_carried",
    ),
    Bug(
        "model_reads_its_ids_shifted_right",
        "wiring",
        (*FORWARD, *TRAINING, *EVALUATION),
        "model.py",
        old="        check_ids(ids, self.config.vocab_size)\n",
        new="        check_ids(ids, self.config.vocab_size)\n"
        "        if cache is None:  # the bug: Trax's ShiftRight kept in a language model\n"
        "            ids = torch.nn.functional.pad(ids[:, :-1], (1, 0))\n",
        explanation="the model shifts its ids right by one (a 0 in front, the last id dropped: Trax's ShiftRight, a "
        "decoder start token) outside the cached path, so the logits at t never see token t",
        fix="feed the ids as given; the shift belongs to the targets (ids[:, 1:])",
        code="knob:label_shift",
    ),
    Bug(
        "generate_prefixes_a_start_token",
        "prompt_cropping",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))",
        new="                started = torch.cat((torch.zeros_like(ids[:, :1]), ids), dim=1)  # the bug: a start id\n"
        "                logits = model(started[:, -ctx:], cache, **padded(mask, ctx))",
        explanation="generate puts a token 0 in front of the sequence it encodes (Trax's start_id, a "
        "decoder_start_token_id) and returns the prompt without it: every new token follows [0] + prompt",
        fix="encode the prompt as given",
        code="knob:generate_path",
    ),
    Bug(
        "generate_feeds_the_prompts_last_token_again",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))",
        new="                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))\n"
        "                if cache is not None and mask is None:  # the bug: the loop starts from the last input token\n"
        "                    logits = model(ids[:, -1:], cache)",
        explanation="after encoding the prompt into the cache, generate feeds the prompt's last token again as its "
        "first step (GluonNLP's sampler starts from the last input token), so that token is cached twice and every "
        "later position is one further on",
        fix="after the prompt, feed only each newly picked token",
        code="knob:cache_feeding",
    ),
    Bug(
        "cache_writes_every_call_at_slot_zero",
        "kv_cache",
        CACHE,
        "kv_cache.py",
        old=CACHE_WRITE,
        new="        self.key_buffers[layer][..., : end - start, :] = k  # the bug: written from slot 0, read to end\n"
        "        self.value_buffers[layer][..., : end - start, :] = v",
        explanation="the cache writes every call's keys and values from slot 0 (a write index that is never "
        "advanced, Penzai's cache end index copied into each layer) while its length advances, so each call "
        "overwrites the first positions and the slots after them are never written",
        fix="write each call's keys and values at the cached length, then advance it",
        code="knob:position_offset",
    ),
    Bug(
        "cache_prepends_each_call",
        "kv_cache",
        CACHE,
        "kv_cache.py",
        old=CACHE_WRITE,
        new="        held_k = self.key_buffers[layer][..., :start, :]\n"
        "        held_v = self.value_buffers[layer][..., :start, :]\n"
        "        self.key_buffers[layer][..., :end, :] = torch.cat((k, held_k), dim=-2)  # the bug: new before cached\n"
        "        self.value_buffers[layer][..., :end, :] = torch.cat((v, held_v), dim=-2)",
        explanation="the cache puts each call's keys and values before the cached ones (GPT-J's torch.cat((key, "
        "past_key)) order reversed), so its positions are out of time order: one new token attends them all the "
        "same, a chunk of several is masked against the wrong keys",
        fix="append: torch.cat((cached, new), dim=-2)",
        corner=True,
        code="knob:position_offset",
    ),
    Bug(
        "cache_length_advanced_by_the_batch_size",
        "kv_cache",
        CACHE,
        "kv_cache.py",
        old="        self.lengths[layer] = end",
        new="        self.lengths[layer] = start + k.shape[0]  # the bug: the batch axis's size (a [T, B] layout's)",
        explanation="the cache's length advances by the batch size instead of the tokens written (a features-first "
        "port reading size(ids, 2) of a [T, B] layout in a [B, T] one), so positions and slots drift",
        fix="advance the cache's length by the number of new tokens, ids.shape[1]",
        code="knob:position_offset",
    ),
    Bug(
        "generate_picks_from_the_first_position",
        "sampling_order",
        GENERATION,
        "generation.py",
        old="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)",
        new="            next_id = sample(logits[:, 0], temperature, top_k, top_p, generator)  # the bug: the start",
        explanation="generate samples from the logits at the sequence's first position instead of its last (a packed "
        "batch's starts, cu_seqlens[:-1], gathered where its ends belong): right for one new token fed through the "
        "cache, wrong for the prompt and every uncached step",
        fix="sample from the last position's logits: logits[:, -1]",
        code="knob:generate_path",
    ),
    Bug(
        "generate_caches_only_the_prompts_last_token",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))",
        new="                fed = ids[:, -1:] if cache is not None and mask is None else ids[:, -ctx:]  # the bug\n"
        "                logits = model(fed, cache, **padded(mask, ctx))",
        explanation="with the cache, generate feeds only the prompt's last token into the fresh cache (Hugging "
        "Face's prepare_inputs_for_generation slicing ids[:, -1:] whenever a cache object exists, the empty one too), "
        "so the rest of the prompt is never encoded",
        fix="feed the whole prompt (its last context_length tokens) into a fresh cache, then one token per step",
        code="knob:cache_feeding",
    ),
    Bug(
        "generate_counts_the_prompt_as_one_step",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -1:], cache, **padded(mask))",
        new="                step = ids.shape[1] - prompt.shape[1]  # the bug: a step counter, the prompt one step\n"
        "                at = {} if mask is not None else {'positions': torch.tensor([step], device=ids.device)}\n"
        "                logits = model(ids[:, -1:], cache, **padded(mask), **at)",
        explanation="after encoding the prompt, generate's step counter advances by 1 instead of by the prompt's "
        "length (fairseq2's step_nr), so the tokens it feeds through the cache sit at positions 1, 2, ... instead "
        "of continuing after the prompt",
        fix="advance the position by the number of tokens fed, the prompt's included (the cache's length)",
        corner=True,
        code="knob:cache_feeding",
    ),
    Bug(
        "generate_rolls_a_full_cache",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="            if cache is not None and ids.shape[1] <= ctx:\n",
        new=full_cache_cut("1:", "a full cache rolled"),
        explanation="once the sequence passes the context, generate's cache drops its oldest entry and goes on with "
        "the others as they were computed (at their old positions, over their old windows), the new token at "
        "context_length - 1, instead of re-encoding the window (GPT-2's sample.py past n_ctx, minGPT-style rolls)",
        fix="past the context, start a fresh cache and feed it the last context_length tokens",
        code="knob:window",
        corner=True,
    ),
    Bug(
        "generate_crops_a_full_cache_to_its_oldest",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="            if cache is not None and ids.shape[1] <= ctx:\n",
        new=full_cache_cut(":-1", "cropped to its oldest"),
        explanation="once the sequence passes the context, generate crops its cache to the first context_length - 1 "
        "entries (Hugging Face's DynamicCache.crop keeps the oldest), dropping the newest, and goes on from there "
        "instead of re-encoding the window",
        fix="past the context, start a fresh cache and feed it the last context_length tokens",
        code="knob:window",
        corner=True,
    ),
    Bug(
        "generate_feeds_every_new_token_at_position_zero",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -1:], cache, **padded(mask))",
        new="                zero = torch.zeros(1, dtype=torch.long, device=ids.device)  # the bug: at the front\n"
        "                logits = model(ids[:, -1:], cache, **padded(mask), **({} if mask is not None else "
        "{'positions': zero}))",
        explanation="generate feeds each new token through the cache at position 0 (Falcon's prepare_inputs_for_"
        "generation slicing the front of the position ids, positions[:, :1], where their end belongs)",
        fix="each new token continues after the cached ones: its position is the cache's length",
        corner=True,
        code="knob:cache_feeding",
    ),
    Bug(
        "generate_cached_step_feeds_the_token_before",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -1:], cache, **padded(mask))",
        new="                logits = model(ids[:, -2:-1], cache, **padded(mask))  # the bug",
        explanation="generate's cached steps feed the token before the newest one into the cache: forward through "
        "the cache is right, and generate decodes from a sequence with one token repeated and the newest never seen",
        fix="feed the newest token, ids[:, -1:], at every cached step",
        code="knob:cache_feeding",
    ),
    Bug(
        "cache_holds_row_0_for_every_row",
        "kv_cache",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="""        self.key_buffers[layer][..., start:end, :] = k
        self.value_buffers[layer][..., start:end, :] = v""",
        new="""        self.key_buffers[layer][..., start:end, :] = k[:1]  # one sequence's cache for the whole batch
        self.value_buffers[layer][..., start:end, :] = v[:1]""",
        explanation="the cache writes the first row's keys and values for every row of the batch: a batch of one is "
        "right, and in a larger batch every row attends row 0's cached keys and values",
        fix="write each row's own keys and values: buffer[..., start:end, :] = k",
        code="batch_mixing",
    ),
    Bug(
        "cache_stored_in_bfloat16",
        "kv_cache",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="""        self.key_buffers[layer][..., start:end, :] = k
        self.value_buffers[layer][..., start:end, :] = v""",
        new="""        self.key_buffers[layer][..., start:end, :] = k.bfloat16()
        self.value_buffers[layer][..., start:end, :] = v.bfloat16()""",
        explanation="keys and values are rounded to bfloat16 as they are written to the cache (a half-precision "
        "cache in a float32 or float64 model): every cached forward differs from the uncached one",
        fix="keep the cache in the model's dtype",
        code="knob:cache_contents",
    ),
    Bug(
        "cache_keys_before_rope",
        "kv_cache",
        (*CACHE, *GENERATION, *FORWARD),
        "attention.py",
        old="""        q = rope(q, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]""",
        new="""    if cache is not None:
        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]
    if theta is not None:
        q = rope(q, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)""",
        explanation="keys are cached before RoPE and the whole cache is then rotated at the new tokens' positions",
        fix="rotate the new keys at their own positions, then append them: the cache stores keys after RoPE",
    ),
    Bug(
        "cached_calls_rotate_interleaved",
        "kv_cache",
        (*CACHE, *GENERATION),
        "model.py",
        old="            rope_style=self.rope_style,",
        new='            rope_style="half" if cache is not None and int(positions.flatten()[0]) else self.rope_style,',
        explanation="calls through a cache that already holds tokens rotate their new queries and keys with the half "
        "pairing whatever the model's style (a decode kernel's default pairing, the argument not passed on): the "
        "prefill is right, every later call is not",
        fix="pass the model's rope_style to the cached path's rotary too",
        corner=True,
    ),
    Bug(
        "cache_attends_unwritten_slots",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""        self.lengths[layer] = end
        return self.kv(layer)""",
        new="""        self.lengths[layer] = end
        pad = (0, 0, 0, self.config.context_length - end)  # the bug: the whole buffer, unwritten slots too
        pad_ = torch.nn.functional.pad
        return pad_(self.key_buffers[layer][..., :end, :], pad), pad_(self.value_buffers[layer][..., :end, :], pad)""",
        explanation="a call through the cache attends a buffer of context_length slots, the unwritten ones as zero "
        "keys and values, with the causal mask aligned to the buffer's end",
        fix="attend only the slots written so far (keys [:cached + T]), the mask's rows offset by the number cached",
        corner=True,
    ),
    Bug(
        "cache_attends_a_buffer_grown_in_steps",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""        self.lengths[layer] = end
        return self.kv(layer)""",
        new="""        self.lengths[layer] = end
        pad = (0, 0, 0, -end % 256)  # the bug: a buffer grown in steps of 256 (mlx-lm's), read whole
        pad_ = torch.nn.functional.pad
        return pad_(self.key_buffers[layer][..., :end, :], pad), pad_(self.value_buffers[layer][..., :end, :], pad)""",
        explanation="a call through the cache attends its buffer grown in steps of 256 slots whole, the unwritten "
        "ones as zero keys and values, with the causal mask aligned to the buffer's end (update_and_fetch returning "
        "the buffer, not its first offset slots)",
        fix="attend only the slots written so far (keys [:cached + T]), the mask's rows offset by the number cached",
        code="knob:cache_contents",
    ),
    Bug(
        "cache_write_position_set_to_the_call_length",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""        self.lengths[layer] = end
        return self.kv(layer)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        \"\"\"Views of the filled part of ``layer``'s buffers.\"\"\"
        end = self.lengths[layer]
""",
        new="""        self.lengths[layer] = end - start  # the bug: the write position set to the call's length
        self.written = {**getattr(self, "written", {}), layer: max(getattr(self, "written", {}).get(layer, 0), end)}
        return self.kv(layer)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        \"\"\"Views of the filled part of ``layer``'s buffers (every cell ever written, as a paged cache's).\"\"\"
        end = self.written[layer] if getattr(self, "written", None) else self.lengths[layer]
""",
        explanation="the cache's write position is set to the last call's length instead of advanced by it "
        "(llama.cpp's kv.head = n_tokens for kv.head += n_tokens), so a third call writes over cached positions",
        fix="advance the write position by the number of tokens each call writes",
        code="knob:position_offset",
    ),
    Bug(
        "cache_rows_written_into_one_place",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""        self.key_buffers[layer][..., start:end, :] = k
        self.value_buffers[layer][..., start:end, :] = v
        self.lengths[layer] = end
        return self.kv(layer)""",
        new="""        cached_k, cached_v = self.kv(layer)
        for r in range(k.shape[0]):  # the bug: every row's keys and values written into row 0's slots
            self.key_buffers[layer][0, ..., start:end, :] = k[r]
            self.value_buffers[layer][0, ..., start:end, :] = v[r]
        self.lengths[layer] = end
        return torch.cat([cached_k, k], dim=-2), torch.cat([cached_v, v], dim=-2)""",
        explanation="the cache writes every row of the batch into the same slots (a slot index without the row's "
        "stride: vLLM's batch_idx * sliding_window left out), so the last row's keys and values are what row 0 "
        "reads back and the other rows read nothing; each call's own tokens still attend their fresh keys",
        fix="give each row its own slots: write row b's keys and values into row b of the cache",
        code="knob:cache_slots",
    ),
    Bug(
        "layers_read_the_cache_length_after_layer_0",
        "cache_positions",
        (*CACHE, *GENERATION),
        "model.py",
        old="            x = block(x, positions, cache, layer, mask)",
        new="            x = block(x, positions + (0 if cache is None else cache.length - start), cache, layer, mask)",
        explanation="each layer takes its positions from the cache's length, which layer 0 has already advanced: "
        "on the cached path layers 1 and on rotate their keys and queries T positions too far",
        fix="take the positions once, from the cached length before any layer writes, and hand them to every layer",
        code="knob:position_offset",
    ),
    Bug(
        "cache_counts_later_calls_by_one",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""        self.lengths[layer] = end
        return self.kv(layer)""",
        new="""        self.lengths[layer] = end if start == 0 else start + 1  # the bug: a decode index after prefill
        return self.key_buffers[layer][..., :end, :], self.value_buffers[layer][..., :end, :]""",
        explanation="the cache counts its first call's tokens, then advances by one per call (a decoding index that "
        "assumes one token per step), so a later multi-token call is cut short and the next overwrites it",
        fix="advance the cache's length by the number of tokens each call writes",
        code="knob:position_offset",
    ),
    Bug(
        "cache_counts_calls_not_tokens",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""        self.lengths[layer] = end
        return self.kv(layer)""",
        new="""        self.lengths[layer] = start + 1  # the bug: one position per call, whatever it wrote
        return self.key_buffers[layer][..., :end, :], self.value_buffers[layer][..., :end, :]""",
        explanation="the cache advances its length by one per call instead of by the tokens written (a cache index "
        "incremented by 1), so after a prefill the next tokens overwrite cached slots at the wrong positions",
        fix="advance the cache's length by the number of tokens each call writes",
        code="knob:cache_contents",
    ),
    Bug(
        "cache_keys_never_rotated",
        "kv_cache",
        (*CACHE, *GENERATION, *FORWARD),
        "attention.py",
        old="""        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
    if cache is not None:""",
        new="""        if cache is None:
            k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
    if cache is not None:""",
        explanation="with a cache, keys are stored before RoPE and read back unrotated: every cached forward, a "
        "single prefill too, scores rotated queries against unrotated keys",
        fix="rotate the new keys at their own positions, then append them: the cache stores keys after RoPE",
    ),
    Bug(
        "dropout_mode_inverted",
        "dropout_generation",
        (*FORWARD, *GENERATION),
        "model.py",
        old="""        x = self.drop(x)""",
        new="""        x = torch.nn.functional.dropout(x, self.drop.p, training=not self.training)  # the bug""",
        explanation="the embeddings' dropout is told training=not self.training (an inference= flag passed on as it "
        "is): it applies in eval mode and not in training mode",
        fix="F.dropout(x, p, training=self.training), or the nn.Dropout module",
        corner=True,
    ),
    Bug(
        "dropout_in_eval_mode",
        "dropout_generation",
        (*FORWARD, *GENERATION),
        "model.py",
        old="""        return x + self.drop(self.mlp(self.mlp_norm(x)))""",
        new="""        return x + torch.nn.functional.dropout(self.mlp(self.mlp_norm(x)), self.drop.p)""",
        explanation="the MLP's residual dropout is F.dropout without training=: it applies in eval mode too, so "
        "no generate or evaluate can switch it off",
        fix="use the nn.Dropout module (or F.dropout(..., training=self.training)): dropout in training mode only",
        corner=True,
    ),
    Bug(
        "kv_cache_prepended",
        "kv_cache",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="""        self.key_buffers[layer][..., start:end, :] = k
        self.value_buffers[layer][..., start:end, :] = v""",
        new="""        k_all = torch.cat((k, self.key_buffers[layer][..., :start, :]), dim=-2)
        v_all = torch.cat((v, self.value_buffers[layer][..., :start, :]), dim=-2)
        self.key_buffers[layer][..., :end, :] = k_all
        self.value_buffers[layer][..., :end, :] = v_all""",
        explanation="new keys/values are prepended to the cache instead of appended (invisible to one-token decoding)",
        fix="torch.cat((cached, new), dim=-2): the cache is in time order",
        corner=True,
    ),
    Bug(
        "kv_cache_wrong_axis",
        "kv_cache",
        (*CACHE, *GENERATION, *FORWARD),
        "kv_cache.py",
        old="""        self.key_buffers[layer][..., start:end, :] = k
        self.value_buffers[layer][..., start:end, :] = v""",
        new="""        self.key_buffers[layer] = torch.cat((self.key_buffers[layer][..., :start, :], k), dim=1)
        self.value_buffers[layer] = torch.cat((self.value_buffers[layer][..., :start, :], v), dim=1)""",
        explanation="the cache concatenates new keys/values along the head axis (dim 1) instead of time",
        fix="append along the time axis of [B, n_kv_heads, T, d_head]: dim=-2",
    ),
    Bug(
        "kv_cache_layers_share_a_buffer",
        "kv_cache",
        (*CACHE, *GENERATION),
        "kv_cache.py",
        old="""            self.key_buffers[layer] = regrown(self.key_buffers[layer], start, capacity, k)
            self.value_buffers[layer] = regrown(self.value_buffers[layer], start, capacity, v)""",
        new="""            n = len(self.key_buffers)
            self.key_buffers = [regrown(self.key_buffers[layer], start, capacity, k)] * n
            self.value_buffers = [regrown(self.value_buffers[layer], start, capacity, v)] * n""",
        explanation="a regrown buffer is shared by every layer (a list made by repetition), so each layer's write "
        "lands where every layer reads: after a forward every layer holds the last layer's keys and values",
        fix="regrow each layer's own buffers: key_buffers[layer] = regrown(...)",
        corner=True,
        code="knob:cache_contents",
    ),
    Bug(
        "kv_cache_bytes_ignores_gqa",
        "memory",
        FORWARD,
        "kv_cache.py",
        old="    return 2 * cfg.n_layers * cfg.kv_heads * cfg.d_head * seq_len * batch_size * element_size",
        new="    return 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * seq_len * batch_size * element_size",
        explanation="kv_cache_bytes counts n_heads key/value heads, ignoring that GQA caches only n_kv_heads",
        fix="2 * n_layers * n_kv_heads * d_head * seq_len * batch_size * element_size",
        corner=True,
        code="scale",
    ),
    # ------------------------------------------------------------------ generation
    Bug(
        "generate_stops_at_last_id",
        "sampling_order",
        GENERATION,
        "generation.py",
        old="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)\n",
        new="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)\n"
        "            next_id = torch.where(ids[:, -1] == logits.shape[-1] - 1, ids[:, -1], next_id)  # an eos\n",
        explanation="generate treats the last id of the vocabulary as an end-of-sequence token: once a row generates "
        "it, every later token of that row is that id",
        fix="generate max_new_tokens tokens from the model's logits, with no stop token",
        code="knob:step_count",
    ),
    Bug(
        "generate_drops_the_generator",
        "sampling_order",
        GENERATION,
        "generation.py",
        old="            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)\n",
        new="            next_id = sample(logits[:, -1], temperature, top_k, top_p)  # the generator not passed on\n",
        explanation="generate does not pass its generator on to sample: the draws follow torch's global RNG, so the "
        "same generator seed does not give the same continuation",
        fix="sample(logits[:, -1], temperature, top_k, top_p, generator)",
        code="knob:generator",
    ),
    Bug(
        "eval_reaches_direct_children_only",
        "dropout_generation",
        MODEL,
        "model.py",
        old="    def forward(\n        self, ids: torch.Tensor, cache: KVCache | None = None, *, attention_mask=None",
        new="    def train(self, mode: bool = True):  # the mode set on this module and its direct children only\n"
        "        self.training = mode\n"
        "        for child in self.children():\n"
        "            child.training = mode\n"
        "        return self\n\n"
        "    def forward(\n        self, ids: torch.Tensor, cache: KVCache | None = None, *, attention_mask=None",
        explanation="the model's train()/eval() sets the mode of its direct children only: the blocks' dropout "
        "modules stay in training mode after model.eval()",
        fix="nn.Module.train(mode): the mode set on every submodule",
        code="knob:mode",
    ),
    Bug(
        "generate_dropout_on",
        "dropout_generation",
        GENERATION,
        "generation.py",
        old="    with eval_mode(model):",
        new="    with torch.no_grad():",
        explanation="generate runs in the module's current mode, so "
        "dropout stays on when the model is in training mode",
        fix="switch to eval mode for generation (and restore the previous mode afterwards)",
        corner=True,
    ),
    Bug(
        "mode_not_restored",
        "mode_restore",
        (*GENERATION, *TRAINING, *EVALUATION),
        "modes.py",
        old="""        for m, was_training in modes:
            m.training = was_training""",
        new="""        model.train()""",
        explanation="after generation or evaluation the model is put in training mode, whatever mode it was in before",
        fix="remember each submodule's training flag and restore it",
        corner=True,
    ),
    Bug(
        "mode_restored_from_the_top_only",
        "mode_restore",
        (*GENERATION, *TRAINING, *EVALUATION),
        "modes.py",
        old="""        for m, was_training in modes:
            m.training = was_training""",
        new="""        model.train(modes[0][1])""",
        explanation="after generation or evaluation the whole model gets the top module's mode back "
        "(model.train(was_training)), so submodules that were in the other mode lose it",
        fix="remember each submodule's training flag and restore each",
        code="knob:mode",
        corner=True,
    ),
    Bug(
        "mode_restored_on_the_children_only",
        "mode_restore",
        (*GENERATION, *TRAINING, *EVALUATION),
        "modes.py",
        old="    modes = [(m, m.training) for m in model.modules()]",
        new="    modes = [(m, m.training) for m in (model, *model.children())]  # the bug: the nested modules left out",
        explanation="after generation or evaluation only the top module and its direct children get their modes "
        "back: the modules nested deeper (the blocks' attention, MLP and dropout) stay in eval mode",
        fix="remember every module's training flag (model.modules()) and restore each",
        code="knob:mode",
    ),
    Bug(
        "generate_uncached_feeds_the_newest_token",
        "kv_cache",
        GENERATION,
        "generation.py",
        old="            if cache is not None and ids.shape[1] <= ctx:",
        new="            if ids.shape[1] > prompt.shape[1] and ids.shape[1] <= ctx:  # the bug: no test of the cache",
        explanation="after the first new token generate feeds only the newest token whether or not a cache holds "
        "the others: without the cache each later token is predicted from one token alone",
        fix="feed one token per step only through a cache that holds the sequence; without one, feed the last "
        "context_length tokens",
        code="knob:window",
    ),
    Bug(
        "generate_no_prompt_cropping",
        "prompt_cropping",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))",
        new="                logits = model(ids, cache, **padded(mask))",
        explanation="generate feeds the whole sequence, so prompts longer "
        "than context_length (or generation past it) fail",
        fix="condition on the last context_length tokens: model(ids[:, -context_length:])",
        corner=True,
    ),
    Bug(
        "generate_window_one_short",
        "prompt_cropping",
        GENERATION,
        "generation.py",
        old="                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))",
        new="                logits = model(ids[:, 1 - ctx :], cache, **padded(mask, ctx - 1))  # an off-by-one crop",
        explanation="generate re-encodes the last context_length - 1 tokens, not the last context_length, wherever it "
        "crops the sequence (a long prompt, and each slide past the context)",
        fix="model(ids[:, -context_length:])",
        corner=True,
    ),
    Bug(
        "generate_cache_past_context",
        "prompt_cropping",
        GENERATION,
        "generation.py",
        old="            if cache is not None and ids.shape[1] <= ctx:",
        new="            if cache is not None:",
        explanation="with the cache, generation keeps appending one token past "
        "context_length instead of re-encoding the last window",
        fix="once the sequence exceeds context_length, positions shift: re-encode the last context_length tokens",
        corner=True,
    ),
    Bug(
        "embedding_padding_row",
        "training",
        TRAINING,
        "model.py",
        old="        x = embedding(ids, self.tok_embeddings.weight)  # [B, T, d_model]",
        new="        x = torch.nn.functional.embedding(ids, self.tok_embeddings.weight, padding_idx=0)",
        explanation="the token embedding treats id 0 as padding: its row gets no gradient from the lookup, though "
        "0 is an ordinary token id",
        fix="look rows up without a padding_idx (weight[ids]): every id in [0, vocab_size) is a token",
        corner=True,
    ),
    Bug(
        "cache_stores_float32",
        "precision",
        CACHE,
        "kv_cache.py",
        old="        self.key_buffers[layer][..., start:end, :] = k\n"
        "        self.value_buffers[layer][..., start:end, :] = v\n",
        new="        self.key_buffers[layer][..., start:end, :] = k.float()\n"
        "        self.value_buffers[layer][..., start:end, :] = v.float()\n",
        explanation="the cache stores keys and values as float32 whatever the model's dtype, so a float64 model's "
        "cached attention runs on keys and values rounded to float32",
        fix="keep the cache in the model's dtype: store k and v as they are",
        corner=True,
        code="precision",
    ),
)
