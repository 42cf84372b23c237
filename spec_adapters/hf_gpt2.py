"""Protocol v1 adapter for Hugging Face transformers' ``GPT2LMHeadModel`` (gpt2 family).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_gpt2.py

Models are built from a ``GPT2Config`` made in code, with random or given weights (nothing is
downloaded). Canonical ``[out, in]`` weights become GPT-2's ``Conv1D`` ``[in, out]`` weights, and
``wq, wk, wv`` (with their biases) are fused into ``c_attn``. Only what transformers implements is
exposed: ``GPT2MLP`` (tanh GELU, ``gelu_new``), GPT-2's eager attention function, the causal-LM
loss, the logits warpers, the model's forward with ``DynamicCache``, ``num_parameters`` and
``generate``. GPT-2's LayerNorm is torch's ``nn.LayerNorm``, not transformers code, so
``layernorm`` is left undefined like every other protocol name transformers lacks (the suite
reports them as not provided). Divergences from protocol v1 are listed with their reasons in
``hf_gpt2.xfails.toml``.
"""

from __future__ import annotations

import types

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP, eager_attention_forward

from spec_adapters import hf_common

FAMILIES = ("gpt2",)
# GPT-2's attention has one key/value head per query head: no grouped-query attention.
CAPABILITIES = ("tied_head", "untied_head", "linear_bias", "dropout", "free_d_ff", "rope_theta")
SPEC_XFAILS = "hf_gpt2.xfails.toml"

ATTN_IMPLEMENTATION = "eager"  # transformers' own attention code (the default "sdpa" calls torch's kernel)

# ---------------------------------------------------------------------------------- components


def gelu_mlp(x, w_fc, b_fc, w_proj, b_proj):
    """``GPT2MLP`` (``c_fc`` -> ``gelu_new`` -> ``c_proj``, dropout off) with ``Conv1D`` weights ``w_fc.T``,
    ``w_proj.T``."""
    d_ff, d = w_fc.shape
    cfg = types.SimpleNamespace(hidden_size=d, activation_function="gelu_new", resid_pdrop=0.0)
    mlp = GPT2MLP(d_ff, cfg).to(device=x.device, dtype=x.dtype).eval()
    params = {"c_fc.weight": w_fc.T, "c_fc.bias": b_fc, "c_proj.weight": w_proj.T, "c_proj.bias": b_proj}
    return torch.func.functional_call(mlp, params, (x,))


def scaled_dot_product_attention(q, k, v, mask=None):
    """GPT-2's ``eager_attention_forward`` for ``q [B, H, Tq, d]``, ``k, v [B, H, Tk, d]`` -> ``[B, H, Tq, d]``.

    GPT-2 has one key/value head per query head: the function has no grouped-query path.
    """
    return hf_common.eager_attention(eager_attention_forward, q, k, v, mask)


cross_entropy = hf_common.cross_entropy
lm_loss = hf_common.lm_loss
sampling_probs = hf_common.sampling_probs
sample = hf_common.sample

# --------------------------------------------------------------------------------------- model


def hf_config(config: dict) -> GPT2Config:
    """The ``GPT2Config`` of a protocol config dict (no special tokens: generation never stops early)."""
    if config.get("family", "gpt2") != "gpt2":
        raise ValueError(f"hf_gpt2 adapter: family must be 'gpt2', got {config.get('family')!r}")
    n_kv = config.get("n_kv_heads") or config["n_heads"]
    if n_kv != config["n_heads"]:
        raise ValueError(
            f"GPT2Config cannot express n_kv_heads={n_kv} != n_heads={config['n_heads']}: "
            "transformers' GPT-2 has no grouped-query attention"
        )
    dropout = config.get("dropout", 0.0)
    return hf_common.make_config(
        GPT2Config,
        vocab_size=config["vocab_size"],
        n_positions=config["context_length"],
        n_embd=config["d_model"],
        n_layer=config["n_layers"],
        n_head=config["n_heads"],
        n_inner=config["d_ff"],
        activation_function="gelu_new",
        layer_norm_epsilon=config.get("norm_eps", 1e-5),
        tie_word_embeddings=config.get("tie_embeddings", True),
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation=ATTN_IMPLEMENTATION,
    )


def _layer_names(i: int) -> dict[str, str]:
    h = f"transformer.h.{i}."
    return {
        f"layers.{i}.attn_norm.weight": h + "ln_1.weight",
        f"layers.{i}.attn_norm.bias": h + "ln_1.bias",
        f"layers.{i}.attn.wo.weight": h + "attn.c_proj.weight",
        f"layers.{i}.attn.wo.bias": h + "attn.c_proj.bias",
        f"layers.{i}.mlp_norm.weight": h + "ln_2.weight",
        f"layers.{i}.mlp_norm.bias": h + "ln_2.bias",
        f"layers.{i}.mlp.w_fc.weight": h + "mlp.c_fc.weight",
        f"layers.{i}.mlp.w_fc.bias": h + "mlp.c_fc.bias",
        f"layers.{i}.mlp.w_proj.weight": h + "mlp.c_proj.weight",
        f"layers.{i}.mlp.w_proj.bias": h + "mlp.c_proj.bias",
    }


def plain_names(n_layers: int, tied: bool) -> dict[str, str]:
    """Canonical name -> ``GPT2LMHeadModel`` parameter, for every weight except the fused ``c_attn``.

    ``Conv1D`` weights (names ending ``.weight`` under ``attn``/``mlp``) are stored ``[in, out]``.
    """
    names = {
        "tok_embeddings.weight": "transformer.wte.weight",
        "pos_embeddings.weight": "transformer.wpe.weight",
        "final_norm.weight": "transformer.ln_f.weight",
        "final_norm.bias": "transformer.ln_f.bias",
    }
    for i in range(n_layers):
        names.update(_layer_names(i))
    if not tied:
        names["lm_head.weight"] = "lm_head.weight"
    return names


def is_conv1d(hf_name: str) -> bool:
    return hf_name.endswith(".weight") and (".attn." in hf_name or ".mlp." in hf_name)


def fused_names(n_layers: int) -> dict[str, tuple[str, int]]:
    """Canonical q/k/v name -> (``c_attn`` parameter, slot 0/1/2 along the fused output axis)."""
    return {
        f"layers.{i}.attn.{w}.{kind}": (f"transformer.h.{i}.attn.c_attn.{kind}", slot)
        for i in range(n_layers)
        for slot, w in enumerate(("wq", "wk", "wv"))
        for kind in ("weight", "bias")
    }


def build_model(config: dict, state_dict: dict | None = None) -> GPT2LMHeadModel:
    """``GPT2LMHeadModel(GPT2Config(...))`` in torch's default dtype and device; ``state_dict`` in canonical names.

    Without weights, transformers' own initialisation (``post_init``) stands.
    """
    model = GPT2LMHeadModel(hf_config(config))
    if state_dict is not None:
        load_canonical(model, state_dict)
    return model


@torch.no_grad()
def load_canonical(model: GPT2LMHeadModel, state_dict: dict) -> None:
    n_layers, d = model.config.n_layer, model.config.n_embd
    plain, fused = plain_names(n_layers, model.config.tie_word_embeddings), fused_names(n_layers)
    unknown = sorted(set(state_dict) - set(plain) - set(fused))
    missing = sorted((set(plain) | set(fused)) - set(state_dict))
    if unknown or missing:
        raise ValueError(f"state_dict does not match the canonical names: missing {missing}, unexpected {unknown}")
    params = dict(model.named_parameters())
    for name, value in state_dict.items():
        if name in plain:
            target = params[plain[name]]
            value = value.T if is_conv1d(plain[name]) else value
        else:
            hf, slot = fused[name]
            target = params[hf][..., slot * d : (slot + 1) * d]  # c_attn.weight [d, 3d], c_attn.bias [3d]
            value = value.T if name.endswith(".weight") else value
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(
                f"state_dict[{name!r}] has shape {tuple(value.T.shape if value.dim() == 2 else value.shape)}, "
                f"which does not fit {tuple(target.shape)}"
            )
        target.copy_(value)


def canonical_state_dict(model: GPT2LMHeadModel) -> dict[str, torch.Tensor]:
    n_layers, d = model.config.n_layer, model.config.n_embd
    params = {k: p.detach() for k, p in model.named_parameters(remove_duplicate=False)}
    out = {}
    for canonical, hf in plain_names(n_layers, model.config.tie_word_embeddings).items():
        out[canonical] = params[hf].T if is_conv1d(hf) else params[hf]
    for canonical, (hf, slot) in fused_names(n_layers).items():
        part = params[hf][..., slot * d : (slot + 1) * d]
        out[canonical] = part.T if canonical.endswith(".weight") else part
    return out


def new_cache(model: GPT2LMHeadModel, batch_size: int) -> hf_common.HFCache:
    """An empty ``DynamicCache(config=model.config)``."""
    c = model.config
    return hf_common.new_cache_for(model, batch_size, c.n_head, c.n_embd // c.n_head, c.n_layer)


forward = hf_common.forward
cache_kv = hf_common.cache_kv
generate = hf_common.generate
count_parameters = hf_common.count_parameters
