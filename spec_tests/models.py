"""Model configs, canonical weights and builders shared by the model-level tests."""

from __future__ import annotations

import contextlib

import torch

from . import inputs
from .inputs import S

# All sizes distinct; GQA with n_kv_heads = 2, n_rep = 4; d_head = 10.
LLAMA_GQA = dict(
    family="llama",
    vocab_size=S.V,
    context_length=29,
    d_model=S.d_model,
    n_layers=2,
    n_heads=S.H,
    n_kv_heads=S.H_KV,
    d_ff=S.D_FF,
    rope_theta=10000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
)
LLAMA_MHA = dict(LLAMA_GQA, n_kv_heads=S.H, tie_embeddings=False, rope_theta=500.0)
GPT2 = dict(
    family="gpt2",
    vocab_size=S.V,
    context_length=29,
    d_model=42,
    n_layers=2,
    n_heads=6,
    n_kv_heads=6,
    d_ff=50,
    norm_eps=1e-5,
    tie_embeddings=True,
)

CONFIGS = {"llama_gqa": LLAMA_GQA, "llama_mha": LLAMA_MHA, "gpt2": GPT2}
EMBEDDING_STD = 0.1


def configs_of(family: str) -> dict[str, dict]:
    return {name: cfg for name, cfg in CONFIGS.items() if cfg["family"] == family}


def n_kv(cfg: dict) -> int:
    return cfg.get("n_kv_heads") or cfg["n_heads"]


def d_head(cfg: dict) -> int:
    return cfg["d_model"] // cfg["n_heads"]


def canonical_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Canonical weight names of protocol v1 and their shapes for ``cfg``."""
    d, v, f, dh = cfg["d_model"], cfg["vocab_size"], cfg["d_ff"], d_head(cfg)
    hq, hkv, gpt2 = cfg["n_heads"] * dh, n_kv(cfg) * dh, cfg.get("family", "llama") == "gpt2"
    shapes = {"tok_embeddings.weight": (v, d)}
    if gpt2:
        shapes["pos_embeddings.weight"] = (cfg["context_length"], d)
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        layer = {
            "attn_norm.weight": (d,),
            "attn.wq.weight": (hq, d),
            "attn.wk.weight": (hkv, d),
            "attn.wv.weight": (hkv, d),
            "attn.wo.weight": (d, hq),
            "mlp_norm.weight": (d,),
        }
        if gpt2:
            layer.update(
                {
                    "attn_norm.bias": (d,),
                    "attn.wq.bias": (hq,),
                    "attn.wk.bias": (hkv,),
                    "attn.wv.bias": (hkv,),
                    "attn.wo.bias": (d,),
                    "mlp_norm.bias": (d,),
                    "mlp.w_fc.weight": (f, d),
                    "mlp.w_fc.bias": (f,),
                    "mlp.w_proj.weight": (d, f),
                    "mlp.w_proj.bias": (d,),
                }
            )
        else:
            layer.update({"mlp.w_gate.weight": (f, d), "mlp.w_up.weight": (f, d), "mlp.w_down.weight": (d, f)})
        shapes.update({p + k: s for k, s in layer.items()})
    shapes["final_norm.weight"] = (d,)
    if gpt2:
        shapes["final_norm.bias"] = (d,)
    if not cfg.get("tie_embeddings", True):
        shapes["lm_head.weight"] = (v, d)
    return shapes


def random_state_dict(cfg: dict, *, seed: int, dtype=torch.float64, device="cpu") -> dict[str, torch.Tensor]:
    """Canonical weights at a scale that keeps activations O(1) and every component visible.

    Matrices ~ N(0, 1/fan_in), norm gains in [0.5, 1.5], biases ~ N(0, 0.3²), embeddings
    ~ N(0, 0.1²): small embeddings leave the residual stream to attention and the MLP, so logits
    (and greedy tokens) depend on the whole context. With N(0, 1) embeddings (tied) a model mostly
    echoes its last token, and cropping or sliding mistakes in generation go unseen.
    """
    sd = {}
    for i, (name, shape) in enumerate(canonical_shapes(cfg).items()):
        s = seed * 1000 + i
        if name.endswith("norm.weight"):
            sd[name] = inputs.norm_weight(*shape, seed=s, dtype=dtype, device=device)
        elif name.endswith(".bias"):
            sd[name] = inputs.randn(*shape, seed=s, scale=0.3, dtype=dtype, device=device)
        elif "embeddings" in name:
            sd[name] = inputs.randn(*shape, seed=s, scale=EMBEDDING_STD, dtype=dtype, device=device)
        else:
            sd[name] = inputs.fan_in_weight(*shape, seed=s, dtype=dtype, device=device)
    return sd


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build(m, cfg: dict, state_dict: dict | None = None, *, dtype=None, device=None):
    """``m.build_model(cfg, state_dict)`` created in the weights' dtype and device, in eval mode.

    The model is built under that default dtype and device so that no implementation rounds
    float64 weights through float32 while loading them.
    """
    if state_dict is not None:
        first = next(iter(state_dict.values()))
        dtype, device = dtype or first.dtype, device or first.device
    dtype, device = dtype or torch.float64, device or "cpu"
    with default_dtype(dtype), torch.device(device):
        model = m.build_model(cfg, state_dict)
    return model.to(device=device, dtype=dtype).eval()


def logits(m, cfg: dict, state_dict: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a freshly built model: ``[B, T, V]``."""
    return m.forward(build(m, cfg, state_dict), ids)
