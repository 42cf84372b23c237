"""Hugging Face transformers' ``LlamaForCausalLM`` at a protocol config, with canonical weights.

Hugging Face pairs RoPE channels in the "half" style (``i, i + d_head/2``). A model whose
canonical weights are in the "interleaved" style is the same function as a Hugging Face model
whose q/k projection rows are permuted within each head (even channels first, then odd ones),
so ``hf_state_dict`` permutes them and all contenders compute the same logits.
"""

from __future__ import annotations

import inspect

import torch
from einops import rearrange

from spec_adapters.hf_names import LLAMA_LAYER_NAMES


def available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str:
    import transformers

    return transformers.__version__


def hf_config(config: dict):
    """The ``LlamaConfig`` of a protocol llama config (SDPA attention, no biases)."""
    from transformers import LlamaConfig

    if config.get("family", "llama") != "llama":
        raise ValueError(f"Hugging Face comparison runs the llama family only, got {config.get('family')!r}")
    n_heads = config["n_heads"]
    return LlamaConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["d_model"],
        intermediate_size=config["d_ff"],
        num_hidden_layers=config["n_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=config.get("n_kv_heads") or n_heads,
        head_dim=config["d_model"] // n_heads,
        max_position_embeddings=config["context_length"],
        rms_norm_eps=config.get("norm_eps", 1e-5),
        rope_theta=config.get("rope_theta", 10000.0),
        tie_word_embeddings=config.get("tie_embeddings", True),
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="sdpa",
    )


def interleaved_to_half_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Permute the rows of a q/k projection ``[H*d_head, d]`` within each head from interleaved
    pairs ``(2i, 2i+1)`` to half pairs ``(i, i + d_head/2)``."""
    return rearrange(weight, "(h pairs two) d -> (h two pairs) d", h=n_heads, two=2)


def hf_state_dict(canonical: dict, config: dict, rope_style: str) -> dict[str, torch.Tensor]:
    """Canonical llama weights under Hugging Face names (q/k rows permuted for ``interleaved``)."""
    n_heads, n_kv = config["n_heads"], config.get("n_kv_heads") or config["n_heads"]
    out = {
        "model.embed_tokens.weight": canonical["tok_embeddings.weight"],
        "model.norm.weight": canonical["final_norm.weight"],
    }
    if "lm_head.weight" in canonical:
        out["lm_head.weight"] = canonical["lm_head.weight"]
    for i in range(config["n_layers"]):
        for ours, theirs in LLAMA_LAYER_NAMES.items():
            w = canonical[f"layers.{i}.{ours}"]
            if rope_style == "interleaved" and ours in ("attn.wq.weight", "attn.wk.weight"):
                w = interleaved_to_half_rows(w, n_heads if ours == "attn.wq.weight" else n_kv)
            out[f"model.layers.{i}.{theirs}"] = w
    return out


def build_hf_llama(config: dict, canonical: dict, rope_style: str):
    """A ``LlamaForCausalLM`` computing the same function as the canonical weights in ``rope_style``."""
    from transformers import LlamaForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(next(iter(canonical.values())).dtype)  # load without rounding
    try:
        model = LlamaForCausalLM(hf_config(config))
    finally:
        torch.set_default_dtype(previous)
    missing, unexpected = model.load_state_dict(hf_state_dict(canonical, config, rope_style), strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.get("tie_embeddings", True))]
    if missing or unexpected:
        raise ValueError(f"Hugging Face weight mapping: missing {missing}, unexpected {unexpected}")
    if config.get("tie_embeddings", True):
        model.tie_weights()
    return model


def _cache_keyword(model) -> str:
    """``cache`` in recent transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def run(model, ids: torch.Tensor, cache=None, use_cache: bool = False):
    """``(logits, cache)`` of one Hugging Face forward call."""
    kwargs = {_cache_keyword(model): cache} if cache is not None else {}
    out = model(input_ids=ids, use_cache=use_cache, **kwargs)
    new_cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return out.logits, new_cache


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every key and value tensor a Hugging Face cache holds."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for kv in cache for t in kv]  # legacy tuple of (k, v)
