"""The models compared side by side: the implementation under test, the reference, and
Hugging Face's ``LlamaForCausalLM``, built from the same canonical weights.

A ``Contender`` offers the operations the benchmarks time (full forward, prefill into a cache,
one cached decode step, one training step) behind one interface, so a benchmark body is the
same for all three. The implementation and the reference are driven through protocol v1 only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import hf_llama

CONTENDERS = ("impl", "reference", "hf")


def implementation_object(impl):
    """The module behind a ``spec_tests`` ``Implementation`` proxy, or ``impl`` itself."""
    return getattr(impl, "obj", impl)


def rope_style_of(impl) -> str:
    return getattr(implementation_object(impl), "ROPE_STYLE", "interleaved")


def is_reference(impl) -> bool:
    try:
        import reference
    except ImportError:  # e.g. a grading sandbox that hides the reference
        return False
    return implementation_object(impl) is reference


RESIDUAL_PROJECTIONS = ("attn.wo.weight", "mlp.w_down.weight", "mlp.w_proj.weight")


def canonical_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Canonical float32 CPU weights, initialised as protocol v1 says: matrices ~ N(0, 0.02),
    residual projections ~ N(0, 0.02/sqrt(2 n_layers)), norm weights 1, biases 0."""
    from spec_tests.models import canonical_shapes

    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * config["n_layers"])
    weights = {}
    for name, shape in canonical_shapes(config).items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            weights[name] = torch.zeros(shape)
        else:
            std = residual_std if name.endswith(RESIDUAL_PROJECTIONS) else 0.02
            weights[name] = torch.randn(shape, generator=generator) * std
    return weights


class Contender:
    """One model and the operations the benchmarks time."""

    name: str
    label: str
    model: torch.nn.Module
    model_config: dict

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` of a full forward, no cache, no gradients."""
        raise NotImplementedError

    def prefill(self, ids: torch.Tensor):
        """A cache holding ``ids [B, T]`` (the logits are computed and dropped)."""
        raise NotImplementedError

    def decode(self, cache, ids: torch.Tensor):
        """``(logits [B, 1, V], cache)`` after feeding the next tokens ``ids [B, 1]``."""
        raise NotImplementedError

    def cache_tensors(self, cache) -> list[torch.Tensor]:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def train_step(self, optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
        raise NotImplementedError


class ProtocolContender(Contender):
    """A protocol v1 implementation (the one under test, or the reference)."""

    def __init__(self, name: str, impl, label: str, model):
        self.name, self.impl, self.label, self.model = name, impl, label, model

    @torch.no_grad()
    def logits(self, ids):
        self.model.eval()
        return self.impl.forward(self.model, ids)

    @torch.no_grad()
    def prefill(self, ids):
        self.model.eval()
        cache = self.impl.new_cache(self.model, ids.shape[0])
        self.impl.forward(self.model, ids, cache)
        return cache

    @torch.no_grad()
    def decode(self, cache, ids):
        return self.impl.forward(self.model, ids, cache), cache

    def cache_tensors(self, cache):
        n_layers = self.model_config["n_layers"]
        return [t for layer in range(n_layers) for t in self.impl.cache_kv(cache, layer)]

    def train_step(self, optimizer, x, y):
        return self.impl.train_step(self.model, optimizer, x, y)


class HuggingFaceContender(Contender):
    """``transformers.LlamaForCausalLM`` with SDPA attention; the training step is the same
    computation as protocol ``train_step``: mean cross-entropy on pre-shifted targets, AdamW."""

    name = "hf"

    def __init__(self, model):
        self.model = model
        self.label = f"transformers {hf_llama.version()} LlamaForCausalLM (sdpa)"

    @torch.no_grad()
    def logits(self, ids):
        self.model.eval()
        return hf_llama.run(self.model, ids)[0]

    @torch.no_grad()
    def prefill(self, ids):
        self.model.eval()
        return hf_llama.run(self.model, ids, use_cache=True)[1]

    @torch.no_grad()
    def decode(self, cache, ids):
        return hf_llama.run(self.model, ids, cache, use_cache=True)

    def cache_tensors(self, cache):
        return hf_llama.cache_tensors(cache)

    def train_step(self, optimizer, x, y):
        self.model.train()
        optimizer.zero_grad(set_to_none=True)
        logits = hf_llama.run(self.model, x)[0]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        optimizer.step()
        return loss.item()


def build_contender(name: str, impl, config: dict, weights: dict, device: str, dtype: torch.dtype) -> Contender:
    """``name`` in ``CONTENDERS`` at ``config`` with canonical ``weights``, on ``device`` in ``dtype``.

    Raises ``LookupError`` with the reason when the contender cannot run here (Hugging Face not
    installed, a family it does not cover).
    """
    style = rope_style_of(impl)
    if name == "impl":
        impl_label = getattr(impl, "label", getattr(implementation_object(impl), "__name__", "impl"))
        model = impl.build_model(config, weights)
        contender = ProtocolContender("impl", impl, str(impl_label), model)
    elif name == "reference":
        import reference

        model = reference.build_model(config, weights, rope_style=style)
        contender = ProtocolContender("reference", reference, "reference", model)
    elif name == "hf":
        if not hf_llama.available():
            raise LookupError("transformers is not installed")
        if config.get("family", "llama") != "llama":
            raise LookupError(f"the Hugging Face comparison covers the llama family, not {config['family']!r}")
        contender = HuggingFaceContender(hf_llama.build_hf_llama(config, weights, style))
    else:
        raise ValueError(f"unknown contender {name!r}; known: {CONTENDERS}")
    contender.model = contender.model.to(device=device, dtype=dtype).eval()
    contender.model_config = config
    return contender
