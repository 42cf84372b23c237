"""What the two Hugging Face adapters share: the KV cache, sampling, generation, losses and
parameter counting, each mapped onto transformers' own code.

The rule for every adapter in this folder: translate names, layouts and argument forms, never add
behaviour the library lacks. Where transformers does something else than protocol v1 asks, the
adapter lets it, and the divergence is listed, with its reason, in the adapter's
``*.xfails.toml``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import DynamicCache
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.loss.loss_utils import ForCausalLMLoss, fixed_cross_entropy


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask (True = may attend) in transformers' additive form: 0 kept, ``finfo(dtype).min`` masked."""
    if mask is None:
        return None
    return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def eager_attention(attention_forward, q, k, v, mask=None, softcap=None, **module_attributes) -> torch.Tensor:
    """A model's own ``eager_attention_forward`` on per-head tensors: ``[..., H, Tq, d]`` out (any leading dims,
    flattened into the one batch axis transformers' functions take, then restored).

    transformers' function reads ``training`` (and, for GQA, ``num_key_value_groups``) from the
    attention module passed in, and returns ``[B, Tq, H, d]`` ready for the output projection,
    which is transposed back here. ``softcap`` (protocol v2, ``logit_softcap``) is passed on only when set:
    Gemma 2's function takes it, Llama's would swallow it in ``**kwargs`` and ignore it.
    """
    module = types.SimpleNamespace(training=False, **module_attributes)
    capped = {} if softcap is None else {"softcap": softcap}
    lead = q.shape[:-3]  # the protocol's [..., H, T, d]: transformers' functions take exactly one batch axis
    q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    if mask is not None and mask.ndim > 3:
        mask = mask.expand(*lead, *mask.shape[-3:]).reshape(-1, *mask.shape[-3:])
    out, _ = attention_forward(module, q, k, v, additive_mask(mask, q.dtype), scaling=q.shape[-1] ** -0.5, **capped)
    out = out.transpose(1, 2)
    return out.reshape(*lead, *out.shape[1:])


FLOAT_FIELDS = (
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "rope_theta",
    "rms_norm_eps",
    "layer_norm_epsilon",
    "attention_dropout",
)


def make_config(config_class, **kwargs):
    """``config_class(**kwargs)``, with transformers' config validation errors raised as ``ValueError``.

    transformers validates configs (head counts, RoPE dimension) with validators that raise
    ``ValueError``; huggingface_hub's strict dataclasses re-raise that as a
    ``StrictDataclassClassValidationError``, which is not a ``ValueError``. Only the type is
    changed here: the check and its message, naming the values, are transformers' own.
    """
    # the protocol's numbers may be ints where transformers types a field float (amendment 35): given as floats
    kwargs = {k: float(v) if k in FLOAT_FIELDS and type(v) is int else v for k, v in kwargs.items()}
    try:
        return config_class(**kwargs)
    except StrictDataclassError as exc:
        raise ValueError(str(exc)) from exc


# --------------------------------------------------------------------------------- canonical names


def load_named(model, state_dict: dict, names: dict[str, str]) -> None:
    """Copy ``state_dict`` (canonical names, exact shapes) into ``model``'s parameters; ``names`` maps each canonical
    name to the model's parameter name (``hf_names``)."""
    unknown, missing = sorted(set(state_dict) - set(names)), sorted(set(names) - set(state_dict))
    if unknown or missing:
        raise ValueError(f"state_dict does not match the canonical names: missing {missing}, unexpected {unknown}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state_dict.items():
            target = params[names[name]]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"state_dict[{name!r}] has shape {tuple(value.shape)}, expected {tuple(target.shape)}")
            target.copy_(value)


def named_state_dict(model, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """The weights of ``model`` under canonical names (``names``: canonical -> parameter name; a tied head once)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return {canonical: params[hf].detach() for canonical, hf in names.items()}


# ----------------------------------------------------------------------------------------- cache


@dataclass
class HFCache:
    """transformers' ``DynamicCache`` plus what ``cache_kv`` needs to describe it while still empty.

    ``DynamicCache`` creates its per-layer tensors lazily on the first update, so an empty cache has
    no tensors to show; the empty ``[B, n_kv_heads, 0, d_head]`` is built from these fields.
    """

    dynamic: DynamicCache
    batch_size: int
    n_kv_heads: int
    d_head: int
    n_layers: int
    dtype: torch.dtype
    device: torch.device


def new_cache_for(model, batch_size: int, n_kv_heads: int, d_head: int, n_layers: int) -> HFCache:
    p = next(model.parameters())
    return HFCache(DynamicCache(config=model.config), batch_size, n_kv_heads, d_head, n_layers, p.dtype, p.device)


def cache_kv(cache: HFCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(k, v)`` of ``layer``, each ``[B, n_kv_heads, T_cached, d_head]`` (DynamicCache's own layout)."""
    if not 0 <= layer < cache.n_layers:
        raise ValueError(f"cache_kv: layer {layer} out of range for {cache.n_layers} layers")
    layers = cache.dynamic.layers
    if layer < len(layers) and layers[layer].is_initialized:
        return layers[layer].keys, layers[layer].values
    empty = torch.zeros(cache.batch_size, cache.n_kv_heads, 0, cache.d_head, dtype=cache.dtype, device=cache.device)
    return empty, empty


def forward(model, ids: torch.Tensor, cache: HFCache | None = None, *, attention_mask=None) -> torch.Tensor:
    """logits ``[B, T, V]``: the model's own forward; with a cache, positions continue from its length
    (transformers' rule).

    ``attention_mask`` (protocol v2, amendment 23; used by the adapters that declare it): transformers' own 2-D mask
    over the cached and new tokens, with the ``position_ids`` its ``generate`` derives from it
    (``_prepare_position_ids_for_generation``: ``cumsum(mask) - 1``), since the forward alone does not.
    """
    kwargs = {}
    if attention_mask is not None:
        positions = model._prepare_position_ids_for_generation(ids, {"attention_mask": attention_mask})
        kwargs = {"attention_mask": attention_mask, "position_ids": positions[:, -ids.shape[1] :]}
    if cache is None:
        return model(input_ids=ids, use_cache=False, **kwargs).logits
    return model(input_ids=ids, cache=cache.dynamic, use_cache=True, **kwargs).logits


def count_parameters(model) -> int:
    """``PreTrainedModel.num_parameters()``: unique parameters, a tied matrix once."""
    return model.num_parameters()


# -------------------------------------------------------------------------------------- sampling


def _warpers(temperature: float, top_k: int | None, top_p: float | None) -> list:
    """The warpers transformers' ``generate`` applies when sampling, in its order (temperature, top-k, top-p).

    Each is built when the protocol argument is given, so transformers' own argument checks run.
    """
    warpers = [TemperatureLogitsWarper(float(temperature))]
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p=top_p))
    return warpers


def _scores(logits: torch.Tensor, temperature: float, top_k, top_p) -> torch.Tensor:
    """Warped scores ``[N, V]`` (the warpers take 2-D scores) for logits ``[..., V]``."""
    scores = logits.reshape(-1, logits.shape[-1])
    for warp in _warpers(temperature, top_k, top_p):
        scores = warp(None, scores)
    return scores


def sampling_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
):
    """softmax of the warped scores, as transformers' sampling loop computes it; ``temperature == 0`` is
    transformers' greedy decoding (``do_sample=False``): all mass on the argmax."""
    if temperature == 0:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    probs = torch.nn.functional.softmax(_scores(logits, temperature, top_k, top_p), dim=-1)
    return probs.reshape(logits.shape)


def sample(logits, temperature: float = 1.0, top_k=None, top_p=None, generator: torch.Generator | None = None):
    """Token ids ``[...]``: ``torch.multinomial(probs, 1)`` as in transformers' ``_sample``, with the given
    generator."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.nn.functional.softmax(_scores(logits, temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).reshape(logits.shape[:-1])


# ------------------------------------------------------------------------------------ generation


def generate(
    model,
    prompt,
    max_new_tokens,
    temperature=1.0,
    top_k=None,
    top_p=None,
    generator=None,
    use_cache=True,
    *,
    attention_mask=None,
):
    """``model.generate`` itself: no cropping, no sliding window, no mode switch (see the xfails file).
    ``attention_mask`` (protocol v2, amendment 23) is passed on as it is: ``generate`` derives the positions.

    Argument forms only: ``temperature == 0`` is ``do_sample=False``; transformers draws from the
    global RNG, so it is seeded from ``generator`` inside ``torch.random.fork_rng`` (the same
    generator state gives the same tokens, and the caller's global RNG is left untouched).
    """
    kwargs = dict(max_new_tokens=max_new_tokens, use_cache=use_cache, do_sample=temperature != 0)
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if temperature != 0:
        kwargs.update(temperature=float(temperature), top_k=top_k, top_p=top_p)
    devices = [prompt.device] if prompt.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        if generator is not None:
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))
        return model.generate(prompt, **kwargs)


# ---------------------------------------------------------------------------------------- losses


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """``transformers.loss.loss_utils.fixed_cross_entropy`` on flattened ``[N, V]`` logits (mean reduction)."""
    return fixed_cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``ForCausalLMLoss`` (what ``*ForCausalLM(labels=ids)`` computes): labels shifted inside."""
    return ForCausalLMLoss(logits, ids, vocab_size=logits.shape[-1])
