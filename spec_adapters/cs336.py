"""Protocol v1 bridge to a CS336 (Stanford, assignment 1) checkout, used unchanged.

    python -m pytest spec_tests --impl=cs336:path/to/assignment1-basics

Students of that course wire their code to the suite of the course through ``tests/adapters.py``,
a table of public ``run_*`` functions (``run_linear(d_in, d_out, weights, in_features)``, ...).
This bridge loads that file from the checkout (with the checkout on ``sys.path`` so its
``cs336_basics`` imports resolve) and maps protocol names onto it: names and argument forms only,
no computation of its own. The signatures are those of the course's published ``adapters.py``
(2025 edition, read from public copies of it).

What the assignment lacks is declared, so the suite reports it as "not provided" rather than wrong:
``FAMILIES = ("llama",)``; no ``gqa``, ``linear_bias`` or ``dropout``; no ``layernorm``,
``gelu_mlp``, ``sinusoidal_positions``, ``causal_mask``, ``repeat_kv``, ``flash_attention``,
sampling, KV cache, generation, ``train_step``/``train``/``evaluate`` (the table has none of them).
The model is ``run_transformer_lm``, a function of weights and ids: ``build_model`` keeps the
canonical weights given to it (renamed to the course's keys on each call) and ``forward`` calls it,
so only models built from given weights are the student's (``build_model`` without weights raises
``NotImplementedError``: the table has no initialisation). RoPE pairs adjacent channels as in the
course's handout (``ROPE_STYLE = "interleaved"``).

Failures point at the student's code: the loaded object's source root is the checkout, so the
suite names the innermost frame inside it (``cs336_basics/model.py:42 in forward``), never this file.
A root-cause rerun replaces protocol functions of this bridge, not functions inside the student's
modules, so a student's bug in ``softmax`` is also charged in the attention tests that use it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from pathlib import Path

ROPE_STYLE = "interleaved"
FAMILIES = ("llama",)
CAPABILITIES = ("untied_head", "free_d_ff", "rope_theta")  # the course's model has its own lm_head
TABLE = Path("tests") / "adapters.py"

# protocol name -> the course function it is mapped onto (for messages and the docs)
MAPPED = {
    "linear": "run_linear",
    "embedding": "run_embedding",
    "softmax": "run_softmax",
    "silu": "run_silu",
    "rmsnorm": "run_rmsnorm",
    "swiglu": "run_swiglu",
    "rope": "run_rope",
    "scaled_dot_product_attention": "run_scaled_dot_product_attention",
    "multihead_self_attention": "run_multihead_self_attention(_with_rope)",
    "cross_entropy": "run_cross_entropy",
    "lm_loss": "run_cross_entropy",
    "forward": "run_transformer_lm",
    "get_batch": "run_get_batch",
}
# canonical weight name (per layer: the part after "layers.{i}.") -> the course's state-dict key
LAYER_KEYS = {
    "attn_norm.weight": "ln1.weight",
    "attn.wq.weight": "attn.q_proj.weight",
    "attn.wk.weight": "attn.k_proj.weight",
    "attn.wv.weight": "attn.v_proj.weight",
    "attn.wo.weight": "attn.output_proj.weight",
    "mlp_norm.weight": "ln2.weight",
    "mlp.w_gate.weight": "ffn.w1.weight",
    "mlp.w_down.weight": "ffn.w2.weight",
    "mlp.w_up.weight": "ffn.w3.weight",
}


class BridgeError(ValueError):
    """The checkout cannot be bridged (no ``tests/adapters.py``); the message names the path."""


def load(checkout) -> types.ModuleType:
    """A protocol v1 implementation over the CS336 checkout at ``checkout``."""
    root = Path(checkout).expanduser().resolve()
    table_path = root / TABLE
    if not table_path.is_file():
        raise BridgeError(f"cs336:{checkout}: no {TABLE} in {root} (a CS336 assignment 1 checkout has one)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # its `from cs336_basics... import ...`
    name = f"_spec_cs336_adapters_{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, table_path)
    table = importlib.util.module_from_spec(spec)
    sys.modules[name] = table
    try:
        spec.loader.exec_module(table)
    except BaseException:
        del sys.modules[name]
        raise
    return bridge(table, root)


def bridge(table, root: Path) -> types.ModuleType:
    """The implementation object: a module whose source root is the checkout (so failures name the
    student's files), holding the mapped functions for every ``run_*`` the table defines."""
    impl = types.ModuleType(f"cs336_bridge_{root.name}", f"protocol v1 over the CS336 checkout {root}")
    impl.__file__ = str(root / "__init__.py")  # the suite's source root: the checkout
    impl.__path__ = [str(root)]
    impl.ROPE_STYLE, impl.FAMILIES, impl.CAPABILITIES = ROPE_STYLE, FAMILIES, CAPABILITIES
    impl.CS336_TABLE = table
    for protocol_name, maker in _MAKERS.items():
        fn = maker(table)
        if fn is not None:
            setattr(impl, protocol_name, fn)
    return impl


def _has(table, name: str) -> bool:
    return callable(getattr(table, name, None))


def _mapped(maker):
    """Register ``maker(table) -> function`` for the protocol name it is called after."""
    _MAKERS[maker.__name__.removeprefix("make_")] = maker
    return maker


_MAKERS: dict = {}


@_mapped
def make_linear(table):
    if not _has(table, "run_linear"):
        return None

    def linear(x, weight, bias=None):
        if bias is not None:
            raise NotImplementedError("linear with a bias: run_linear has none (the assignment's Linear has no bias)")
        return table.run_linear(weight.shape[1], weight.shape[0], weight, x)

    return linear


@_mapped
def make_embedding(table):
    if not _has(table, "run_embedding"):
        return None

    def embedding(ids, weight):
        return table.run_embedding(weight.shape[0], weight.shape[1], weight, ids)

    return embedding


@_mapped
def make_softmax(table):
    if not _has(table, "run_softmax"):
        return None

    def softmax(x, dim):
        return table.run_softmax(x, dim)

    return softmax


@_mapped
def make_silu(table):
    if not _has(table, "run_silu"):
        return None

    def silu(x):
        return table.run_silu(x)

    return silu


@_mapped
def make_rmsnorm(table):
    if not _has(table, "run_rmsnorm"):
        return None

    def rmsnorm(x, weight, eps=1e-5):
        return table.run_rmsnorm(x.shape[-1], eps, weight, x)

    return rmsnorm


@_mapped
def make_swiglu(table):
    if not _has(table, "run_swiglu"):
        return None

    def swiglu(x, w_gate, w_up, w_down):
        # the course's FFN(x) = W2(SiLU(W1 x) * W3 x): W1 is the gate, W3 the up projection, W2 down
        d_ff, d_model = w_gate.shape
        return table.run_swiglu(d_model, d_ff, w_gate, w_down, w_up, x)

    return swiglu


def _max_seq_len(positions) -> int:
    return int(positions.max()) + 1 if positions.numel() else 1


@_mapped
def make_rope(table):
    if not _has(table, "run_rope"):
        return None

    def rope(x, positions, theta=10000.0):
        if x.shape[-1] % 2:
            raise ValueError(f"rope needs an even head dimension, got d_k = {x.shape[-1]}")
        return table.run_rope(x.shape[-1], theta, _max_seq_len(positions), x, positions)

    return rope


@_mapped
def make_scaled_dot_product_attention(table):
    if not _has(table, "run_scaled_dot_product_attention"):
        return None

    def scaled_dot_product_attention(q, k, v, mask=None):
        if mask is not None:
            mask = mask.expand(*q.shape[:-1], k.shape[-2])  # the course's mask is [..., queries, keys]
        return table.run_scaled_dot_product_attention(q, k, v, mask)

    return scaled_dot_product_attention


@_mapped
def make_multihead_self_attention(table):
    if not (_has(table, "run_multihead_self_attention") and _has(table, "run_multihead_self_attention_with_rope")):
        return None

    def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
        if n_kv_heads is not None and n_kv_heads != n_heads:
            raise ValueError(f"n_kv_heads {n_kv_heads} != n_heads {n_heads}: the assignment has no GQA")
        d_model = x.shape[-1]
        if theta is None:
            return table.run_multihead_self_attention(d_model, n_heads, wq, wk, wv, wo, x)
        import torch

        t = x.shape[-2]
        if positions is None:
            positions = torch.arange(t, device=x.device)
        positions = positions.expand(*x.shape[:-2], t) if positions.dim() == 1 else positions
        return table.run_multihead_self_attention_with_rope(
            d_model, n_heads, _max_seq_len(positions), theta, wq, wk, wv, wo, x, positions
        )

    return multihead_self_attention


@_mapped
def make_cross_entropy(table):
    if not _has(table, "run_cross_entropy"):
        return None

    def cross_entropy(logits, targets, ignore_index=-100):
        # the course's function takes [batch, vocab] logits and [batch] targets, with no ignore_index
        flat, want = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        keep = want != ignore_index
        return table.run_cross_entropy(flat[keep], want[keep])

    return cross_entropy


@_mapped
def make_lm_loss(table):
    ce = make_cross_entropy(table)
    if ce is None:
        return None

    def lm_loss(logits, ids):
        return ce(logits[:, :-1], ids[:, 1:])

    return lm_loss


@_mapped
def make_get_batch(table):
    if not _has(table, "run_get_batch"):
        return None

    def get_batch(data, batch_size, context_length, generator=None, device="cpu"):
        import numpy as np
        import torch

        data = data.cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
        if generator is None:
            return table.run_get_batch(data, batch_size, context_length, str(device))
        # the course's function draws from the global RNGs: seed them from the generator (and put
        # them back afterwards), so that generators seeded alike give the same batches
        seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
        state = np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            np.random.seed(seed)
            torch.manual_seed(seed)
            try:
                return table.run_get_batch(data, batch_size, context_length, str(device))
            finally:
                np.random.set_state(state)

    return get_batch


# ------------------------------------------------------------------------------------- the model


def _course_weights(sd: dict, n_layers: int, tied: bool) -> dict:
    """Canonical weights under the course's keys (the same tensors: gradients reach them)."""
    out = {"token_embeddings.weight": sd["tok_embeddings.weight"], "ln_final.weight": sd["final_norm.weight"]}
    out["lm_head.weight"] = sd["tok_embeddings.weight"] if tied else sd["lm_head.weight"]
    for i in range(n_layers):
        for canonical, course in LAYER_KEYS.items():
            out[f"layers.{i}.{course}"] = sd[f"layers.{i}.{canonical}"]
    return out


def _model_class():
    import torch

    class CourseModel(torch.nn.Module):
        """Canonical weights as parameters; the logits come from the course's ``run_transformer_lm``."""

        def __init__(self, config: dict, state_dict: dict):
            super().__init__()
            self.config = dict(config)
            self.weights = torch.nn.ParameterDict(
                {k.replace(".", "__"): torch.nn.Parameter(v.detach().clone()) for k, v in state_dict.items()}
            )

        def canonical(self) -> dict:
            return {k.replace("__", "."): v for k, v in self.weights.items()}

        def forward(self, ids):
            c = self.config
            weights = _course_weights(self.canonical(), c["n_layers"], c.get("tie_embeddings", True))
            return self.table.run_transformer_lm(
                c["vocab_size"],
                c["context_length"],
                c["d_model"],
                c["n_layers"],
                c["n_heads"],
                c["d_ff"],
                c.get("rope_theta", 10000.0),
                weights,
                ids,
            )

    return CourseModel


@_mapped
def make_build_model(table):
    if not _has(table, "run_transformer_lm"):
        return None

    def build_model(config, state_dict=None):
        if config.get("family", "llama") != "llama":
            raise ValueError(f"family {config.get('family')!r}: the assignment's model is llama-style only")
        if state_dict is None:
            raise NotImplementedError(
                "build_model without weights: the course's table has no initialisation "
                "(run_transformer_lm takes weights)"
            )
        if config.get("n_kv_heads", config["n_heads"]) != config["n_heads"]:
            raise ValueError("n_kv_heads != n_heads: the assignment has no GQA")
        if config.get("norm_eps", 1e-5) != 1e-5:
            raise NotImplementedError(
                f"norm_eps={config['norm_eps']}: run_transformer_lm takes no eps (the assignment's norms use 1e-5)"
            )
        cls = _model_class()
        cls.table = table
        model = cls(config, state_dict)
        if config.get("tie_embeddings", True) and "lm_head__weight" in model.weights:
            del model.weights["lm_head__weight"]
        return model

    return build_model


@_mapped
def make_canonical_state_dict(table):
    if not _has(table, "run_transformer_lm"):
        return None

    def canonical_state_dict(model):
        return dict(model.canonical())

    return canonical_state_dict


@_mapped
def make_forward(table):
    if not _has(table, "run_transformer_lm"):
        return None

    def forward(model, ids, cache=None):
        if cache is not None:
            raise NotImplementedError("forward with a cache: the assignment has no KV cache")
        if ids.shape[-1] > model.config["context_length"]:
            raise ValueError(f"{ids.shape[-1]} tokens exceed context_length {model.config['context_length']}")
        return model(ids)

    return forward


def describe() -> str:
    """The mapping, for docs and ``--help`` texts."""
    lines = [f"{name:<30} <- {course}" for name, course in MAPPED.items()]
    return "\n".join(lines)
