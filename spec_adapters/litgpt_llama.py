"""Protocol v1 adapter for Lightning AI's litgpt ``GPT`` model (llama family), an implementation
written independently of transformers.

    python3 -m pytest spec_tests --impl=spec_adapters/litgpt_llama.py

Install (keeps torch and transformers as they are; litgpt's own pins would downgrade
huggingface_hub under transformers 5):

    pip install --no-deps litgpt==0.5.13 lightning==2.6.6 lightning-utilities==0.15.3 torchmetrics==1.9.0 psutil==7.2.2

Models are ``litgpt.model.GPT`` built from a ``litgpt.Config`` made in code (a Llama: RMSNorm,
``LLaMAMLP``, full rotary, non-parallel residual, no biases), with random or given weights
(nothing is downloaded). Canonical ``wq, wk, wv`` are fused into litgpt's ``qkv`` (all query
heads, then key, then value heads). Only what litgpt implements is exposed: its ``RMSNorm``,
``LLaMAMLP``, ``build_rope_cache`` + ``apply_rope`` (half-split pairs), ``CausalSelfAttention``,
``chunked_cross_entropy``, ``generate.base.sample``, the model forward with its in-model KV
cache, ``utils.num_parameters`` and ``generate.base.generate``. Every other protocol name is left
undefined and reported as not provided.

Mapping decisions (see the README, "Check your own implementation"):
- litgpt has no weight tying: for ``tie_embeddings`` the head gets a copy of the embedding, as
  litgpt's own checkpoint converters do (``state_dict["lm_head.weight"] =
  state_dict["transformer.wte.weight"]``); the tying tests are expected failures.
- litgpt has no dropout anywhere, so the ``dropout`` key has nothing to map to and is ignored.
- litgpt keeps its KV cache inside the model (``set_kv_cache``); ``new_cache`` sets it up and
  returns a handle that remembers how many positions are filled.
- ``generate`` has no uncached path (``use_cache`` only changes speed in protocol v1) and takes
  one sequence: it is called once per batch row.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from litgpt import Config
from litgpt.generate.base import generate as _lit_generate
from litgpt.generate.base import sample as _lit_sample
from litgpt.model import GPT, CausalSelfAttention, LLaMAMLP, RMSNorm, apply_rope, build_rope_cache
from litgpt.utils import chunked_cross_entropy, num_parameters

ROPE_STYLE = "half"
FAMILIES = ("llama",)
# litgpt has no weight tying (its checkpoint converters copy the embedding into lm_head).
CAPABILITIES = ("gqa", "untied_head", "linear_bias", "dropout", "free_d_ff", "rope_theta")
SPEC_XFAILS = "litgpt_llama.xfails.toml"

# ---------------------------------------------------------------------------------- components


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """litgpt's ``RMSNorm(d, eps=eps)`` with ``weight``: ``x [..., d] -> [..., d]``."""
    return torch.func.functional_call(RMSNorm(x.shape[-1], eps=eps).to(x.device), {"weight": weight}, (x,))


def swiglu(x, w_gate, w_up, w_down):
    """litgpt's ``LLaMAMLP``: ``fc_1`` (through SiLU) = ``w_gate``, ``fc_2`` = ``w_up``, ``proj`` = ``w_down``."""
    d_ff, d = w_gate.shape
    mlp = LLaMAMLP(types.SimpleNamespace(n_embd=d, intermediate_size=d_ff, bias=False)).to(
        device=x.device, dtype=x.dtype
    )
    params = {"fc_1.weight": w_gate, "fc_2.weight": w_up, "proj.weight": w_down}
    return torch.func.functional_call(mlp, params, (x,))


def _tables(positions: torch.Tensor, d_head: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``build_rope_cache`` rows at ``positions``: ``positions.shape + [d_head]`` each."""
    n = int(positions.max()) + 1 if positions.numel() else 1
    cos, sin = build_rope_cache(seq_len=n, n_elem=d_head, device=positions.device, base=theta)
    return cos[positions], sin[positions]


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """``apply_rope`` with ``build_rope_cache`` tables at ``positions`` (``[T]`` or broadcastable to ``x.shape[:-1]``).

    ``apply_rope`` takes ``x (N, ..., T, d)`` with tables ``(N or 1, T, d)``; the tables are
    broadcast to ``x`` and both flattened to ``(N, T, d)`` for the call.
    """
    *lead, t, d = x.shape
    cos, sin = _tables(positions, d, theta)
    cos, sin = cos.expand(x.shape).reshape(-1, t, d), sin.expand(x.shape).reshape(-1, t, d)
    return apply_rope(x.reshape(-1, t, d), cos, sin).reshape(x.shape)


def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    """litgpt's ``CausalSelfAttention`` (fused ``qkv``, GQA, causal SDPA) on ``x [B, T, d]``.

    ``theta is None``: ``rotary_percentage=0`` (litgpt's own switch: no channel is rotated).
    Otherwise the ``build_rope_cache`` rows at ``positions`` (default ``arange(T)``) are passed in,
    ``(1, T, d_head)`` as the model does.
    """
    b, t, d = x.shape
    n_kv_heads = n_kv_heads or n_heads
    cfg = Config(
        n_embd=d,
        n_head=n_heads,
        n_query_groups=n_kv_heads,
        rotary_percentage=0.0 if theta is None else 1.0,
        bias=False,
        block_size=t,
        padded_vocab_size=1,
        vocab_size=1,
    )
    attn = CausalSelfAttention(cfg, block_idx=0).to(device=x.device, dtype=x.dtype)
    if positions is None:
        positions = torch.arange(t, device=x.device)
    if theta is None:
        cos = sin = torch.ones(1, t, 0, dtype=x.dtype, device=x.device)
    else:
        cos, sin = _tables(positions, cfg.head_size, theta)
        cos, sin = cos.reshape(-1, t, cfg.head_size), sin.reshape(-1, t, cfg.head_size)
    params = {"qkv.weight": torch.cat((wq, wk, wv)), "proj.weight": wo}
    return torch.func.functional_call(attn, params, (x, cos, sin))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """``litgpt.utils.chunked_cross_entropy`` (its default chunk size 128): mean over non-ignored targets."""
    return chunked_cross_entropy(logits, targets, ignore_index=ignore_index)


def sample(logits, temperature: float = 1.0, top_k=None, top_p=None, generator: torch.Generator | None = None):
    """``litgpt.generate.base.sample`` row by row (it reads one row, ``logits[0, -1]``) -> ids ``logits.shape[:-1]``.

    litgpt draws with ``torch.multinomial`` from the global RNG, so that is seeded from
    ``generator`` inside ``torch.random.fork_rng``. ``top_p=None`` is litgpt's default ``1.0``.
    """
    rows = logits.reshape(-1, logits.shape[-1])
    top_p = 1.0 if top_p is None else top_p
    with _rng_from(generator if temperature > 0 else None, logits.device):  # greedy draws nothing
        ids = [_lit_sample(row[None, None], temperature=temperature, top_k=top_k, top_p=top_p) for row in rows]
    return torch.cat(ids).reshape(logits.shape[:-1])


def _rng_from(generator: torch.Generator | None, device: torch.device):
    """A forked global RNG, seeded from ``generator`` when one is given."""
    fork = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    if generator is None:
        return fork

    class _Seeded:
        def __enter__(self):
            fork.__enter__()
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))

        def __exit__(self, *exc):
            return fork.__exit__(*exc)

    return _Seeded()


# --------------------------------------------------------------------------------------- model


def lit_config(config: dict) -> Config:
    """The ``litgpt.Config`` of a Llama-family protocol config (head size and groups checked by litgpt)."""
    if config.get("family", "llama") != "llama":
        raise ValueError(f"litgpt_llama adapter: family must be 'llama', got {config.get('family')!r}")
    return Config(
        name="spec-llama",
        block_size=config["context_length"],
        vocab_size=config["vocab_size"],
        padded_vocab_size=config["vocab_size"],
        n_layer=config["n_layers"],
        n_head=config["n_heads"],
        n_embd=config["d_model"],
        n_query_groups=config.get("n_kv_heads") or config["n_heads"],
        rotary_percentage=1.0,
        rope_base=config.get("rope_theta", 10000.0),
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=config.get("norm_eps", 1e-5),
        mlp_class_name="LLaMAMLP",
        intermediate_size=config["d_ff"],
    )


LAYER_NAMES = {
    "attn_norm.weight": "norm_1.weight",
    "attn.wo.weight": "attn.proj.weight",
    "mlp_norm.weight": "norm_2.weight",
    "mlp.w_gate.weight": "mlp.fc_1.weight",
    "mlp.w_up.weight": "mlp.fc_2.weight",
    "mlp.w_down.weight": "mlp.proj.weight",
}


def _tied(model: GPT) -> bool:
    return getattr(model, "_spec_tie_embeddings", True)


def plain_names(n_layers: int, tied: bool) -> dict[str, str]:
    """Canonical name -> ``GPT`` parameter, for every weight except the fused ``qkv``."""
    names = {"tok_embeddings.weight": "transformer.wte.weight", "final_norm.weight": "transformer.ln_f.weight"}
    for i in range(n_layers):
        names.update({f"layers.{i}.{c}": f"transformer.h.{i}.{g}" for c, g in LAYER_NAMES.items()})
    if not tied:
        names["lm_head.weight"] = "lm_head.weight"
    return names


def _qkv_slices(model: GPT) -> dict[str, slice]:
    c = model.config
    q, kv = c.n_head * c.head_size, c.n_query_groups * c.head_size
    return {"wq": slice(0, q), "wk": slice(q, q + kv), "wv": slice(q + kv, q + 2 * kv)}


def build_model(config: dict, state_dict: dict | None = None) -> GPT:
    """``GPT(Config(...))`` in torch's default dtype and device; ``state_dict`` in canonical names.

    Without weights: ``model.apply(model._init_weights)``, litgpt's own initialiser. With
    ``tie_embeddings`` the head holds a copy of the embedding (litgpt has no tying).
    """
    model = GPT(lit_config(config))
    model._spec_tie_embeddings = bool(config.get("tie_embeddings", True))
    if state_dict is None:
        model.apply(model._init_weights)
        if _tied(model):
            with torch.no_grad():
                model.lm_head.weight.copy_(model.transformer.wte.weight)
    else:
        load_canonical(model, state_dict)
    return model


@torch.no_grad()
def load_canonical(model: GPT, state_dict: dict) -> None:
    n_layers = model.config.n_layer
    plain = plain_names(n_layers, _tied(model))
    fused = {f"layers.{i}.attn.{w}.weight": (i, w) for i in range(n_layers) for w in ("wq", "wk", "wv")}
    unknown = sorted(set(state_dict) - set(plain) - set(fused))
    missing = sorted((set(plain) | set(fused)) - set(state_dict))
    if unknown or missing:
        raise ValueError(f"state_dict does not match the canonical names: missing {missing}, unexpected {unknown}")
    params, slices = dict(model.named_parameters()), _qkv_slices(model)
    for name, value in state_dict.items():
        if name in plain:
            target = params[plain[name]]
        else:
            i, w = fused[name]
            target = params[f"transformer.h.{i}.attn.qkv.weight"][slices[w]]
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"state_dict[{name!r}] has shape {tuple(value.shape)}, expected {tuple(target.shape)}")
        target.copy_(value)
    if _tied(model):  # litgpt's converters: lm_head.weight = transformer.wte.weight (a copy)
        model.lm_head.weight.copy_(model.transformer.wte.weight)


def canonical_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    params = {k: p.detach() for k, p in model.named_parameters()}
    out = {c: params[g] for c, g in plain_names(model.config.n_layer, _tied(model)).items()}
    slices = _qkv_slices(model)
    for i in range(model.config.n_layer):
        for w, rows in slices.items():
            out[f"layers.{i}.attn.{w}.weight"] = params[f"transformer.h.{i}.attn.qkv.weight"][rows]
    return out


@dataclass
class LitCache:
    """A handle on the KV cache litgpt keeps inside the model (``set_kv_cache``): how many positions are filled."""

    model: GPT
    batch_size: int
    length: int = 0


def new_cache(model: GPT, batch_size: int) -> LitCache:
    """``model.set_kv_cache(batch_size)`` (zeroed buffers of ``max_seq_length`` positions) and a handle on it."""
    p = next(model.parameters())
    model.set_kv_cache(batch_size=batch_size, device=p.device, dtype=p.dtype)
    return LitCache(model, batch_size)


def forward(model: GPT, ids: torch.Tensor, cache: LitCache | None = None) -> torch.Tensor:
    """``model(ids)``; with a cache, ``model(ids, input_pos, input_pos_maxp1)`` at the positions after the cached
    ones."""
    if cache is None:
        return model(ids)
    t = ids.shape[1]
    input_pos = torch.arange(cache.length, cache.length + t, device=ids.device)
    logits = model(ids, input_pos, input_pos_maxp1=cache.length + t)
    cache.length += t
    return logits


def cache_kv(cache: LitCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The filled part of litgpt's buffers ``k, v (B, n_query_groups, max_seq_length, head_size)``."""
    blocks = cache.model.transformer.h
    if not 0 <= layer < len(blocks):
        raise ValueError(f"cache_kv: layer {layer} out of range for {len(blocks)} layers")
    kv = blocks[layer].attn.kv_cache
    return kv.k[:, :, : cache.length], kv.v[:, :, : cache.length]


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
    """``litgpt.generate.base.generate`` for each row of ``prompt [B, T]`` -> ``[B, T + max_new_tokens]``.

    litgpt's generate always decodes through its KV cache (set here per row, as its own scripts
    do) and reads the global RNG, which is seeded from ``generator`` in a fork.
    """
    p = next(model.parameters())
    rows = []
    with _rng_from(generator, prompt.device):
        for row in prompt:
            model.set_kv_cache(batch_size=1, device=p.device, dtype=p.dtype)
            rows.append(
                _lit_generate(
                    model,
                    row,
                    row.shape[0] + max_new_tokens,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=1.0 if top_p is None else top_p,
                )
            )
    model.clear_kv_cache()
    return torch.stack(rows)


def count_parameters(model: GPT) -> int:
    """``litgpt.utils.num_parameters``: unique parameters (the copied head counts separately)."""
    return num_parameters(model)
