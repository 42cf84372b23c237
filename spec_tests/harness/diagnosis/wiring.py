"""Model wiring: is a failing model output the reference model's with one wiring choice changed?

The component knobs (``model_knobs.py``) name a mistake inside one component function. The mistakes of
real model code are as often in how the parts are connected: a sublayer's output replaces the residual
stream instead of being added to it, the block is post-LN, the final norm is skipped, attention and the MLP
run in parallel (GPT-J) instead of one after the other, the token embedding is scaled by sqrt(d_model)
where the family does not scale it, or a canonical weight is laid out wrongly when loaded (transposed,
q/k/v rows not head-major, wq and wk swapped).

Each ``Wiring`` changes the reference model the check's computation builds, never the reference's code:
the reference subject answers ``build_model`` (for the one computation) with a build that loads transformed
weights (``weights``) and then rewires the built module in place (``rewire``: a block's ``forward`` replaced
on the instance, the final norm replaced by an identity, the configuration's embedding scale turned). A
wiring that cannot apply to the check's configuration (wq and wk swapped with grouped keys, nothing square
to transpose) raises ``NotApplicable`` and is not offered. The variants run only when a model-level check
failed (``Spec.check(model_knobs=True)``) and share ``model_knobs``' memo, so a test function's further
cases try only what fitted its first.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


class NotApplicable(Exception):
    """The wiring cannot be changed this way on this configuration (so it cannot be what the output shows)."""


def _config_value(config, key: str, default=None):
    value = config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)
    return default if value is None else value


def _heads(config) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, d_head)`` of a protocol config (a dict, or the reference's parsed config)."""
    n_heads = int(_config_value(config, "n_heads"))
    n_kv = int(_config_value(config, "n_kv_heads", n_heads))
    return n_heads, n_kv, int(_config_value(config, "d_model")) // n_heads


# ----------------------------------------------------------------------------------------- the blocks


def _sublayers(block, positions, cache, layer, mask):
    """The block's two branches as functions of their input (with protocol v2's ``post_norms`` on their
    outputs where the block has them)."""
    post = bool(getattr(block, "post_norms", False))

    def attn(h):
        out = block.attn(h, positions, cache, layer, mask)
        return block.attn_post_norm(out) if post else out

    def mlp(h):
        out = block.mlp(h)
        return block.mlp_post_norm(out) if post else out

    return attn, mlp


def _block_forward(kind: str):
    """A ``Block.forward`` wired as ``kind``, for one instance (bound with ``types.MethodType``)."""

    def forward(self, x, positions, cache, layer, mask=None):
        attn, mlp = _sublayers(self, positions, cache, layer, mask)
        n1, n2, drop = self.attn_norm, self.mlp_norm, self.drop
        if kind == "no_attn_residual":
            x = drop(attn(n1(x)))
            return x + drop(mlp(n2(x)))
        if kind == "no_mlp_residual":
            x = x + drop(attn(n1(x)))
            return drop(mlp(n2(x)))
        if kind == "mlp_residual_from_input":
            h = x + drop(attn(n1(x)))
            return x + drop(mlp(n2(h)))
        if kind == "post_ln":
            x = n1(x + drop(attn(x)))
            return n2(x + drop(mlp(x)))
        if kind == "norm_on_stream":
            x = n1(x)
            x = x + drop(attn(x))
            x = n2(x)
            return x + drop(mlp(x))
        if kind == "norm_on_attn_stream":
            x = n1(x)
            x = x + drop(attn(x))
            return x + drop(mlp(n2(x)))
        if kind == "norm_on_mlp_stream":
            x = x + drop(attn(n1(x)))
            x = n2(x)
            return x + drop(mlp(x))
        if kind == "post_norm_after_attn_residual":  # protocol v2's post_norms: the norm on the sum
            x = self.attn_post_norm(x + drop(self.attn(n1(x), positions, cache, layer, mask)))
            return x + drop(mlp(n2(x)))
        if kind == "post_norm_after_mlp_residual":
            x = x + drop(attn(n1(x)))
            return self.mlp_post_norm(x + drop(self.mlp(n2(x))))
        if kind == "parallel":
            return x + drop(attn(n1(x))) + drop(mlp(n2(x)))
        if kind == "parallel_shared_norm":
            h = n1(x)
            return x + drop(attn(h)) + drop(mlp(h))
        raise ValueError(f"unknown block wiring {kind!r}")

    return forward


def _blocks(model):
    """The model's blocks (``NotApplicable`` where it has none to rewire)."""
    layers = getattr(model, "layers", None)
    if not layers:
        raise NotApplicable("the model has no blocks")
    return layers


def _rewire_blocks(kind: str):
    def rewire(model) -> None:
        layers = _blocks(model)
        for block in layers:
            if kind.startswith("post_norm_after") and not getattr(block, "post_norms", False):
                raise NotApplicable("the blocks have no post norms")
            block.forward = types.MethodType(_block_forward(kind), block)

    return rewire


def _without_gain(norm: nn.Module) -> nn.Module:
    """``norm`` with its gain 1 and its bias 0: the normalised value a norm computes before its affine part."""
    bare = copy.deepcopy(norm)
    with torch.no_grad():
        bare.weight.fill_(0.0 if getattr(bare, "offset", False) else 1.0)  # an offset norm's gain is 1 + weight
        if getattr(bare, "bias", None) is not None:
            bare.bias.zero_()
    return bare


def _fused_stream_forward(first: bool, carried: tuple | None):
    """A block whose fused add-and-norms hand on their normalised sum as the residual stream: ``carried``, the
    (attention, MLP) norms whose output is the stream (the block's own norms without their gain), or None for the
    block's norms themselves; block 0's attention norm has no residual to add, so its stream is right."""

    def forward(self, x, positions, cache, layer, mask=None):
        attn, mlp = _sublayers(self, positions, cache, layer, mask)
        norms = (self.attn_norm, self.mlp_norm)
        for i, (norm, stream, branch) in enumerate(zip(norms, carried or norms, (attn, mlp), strict=True)):
            if first and i == 0:
                x = x + self.drop(branch(norm(x)))
                continue
            h = norm(x)
            x = (h if stream is norm else stream(x)) + self.drop(branch(h))
        return x

    return forward


class _Projection:
    """A linear layer's weight widened to read ``[normalised, stream]`` (``x`` of twice the width), with the half it
    does not read zero: ``stream`` picks the second half."""

    def __init__(self, linear: nn.Module, stream: bool):
        zero = torch.zeros_like(linear.weight)
        self.weight = torch.cat((zero, linear.weight) if stream else (linear.weight, zero), dim=-1)
        self.bias = linear.bias


class _Reading:
    """An attention module whose q, k, v projections read the wider input ``[normalised, stream]``: ``roles`` (a
    subset of ``wq``, ``wk``, ``wv``) the un-normalised stream, the others the normalised one; every other attribute
    is the module's own."""

    def __init__(self, attn: nn.Module, roles: tuple[str, ...]):
        self._attn = attn
        self.wq, self.wk, self.wv = (_Projection(getattr(attn, p), p in roles) for p in ("wq", "wk", "wv"))

    def __getattr__(self, name):
        return getattr(self._attn, name)


def _stream_reading_forward(roles: tuple[str, ...]):
    """A ``Block.forward`` whose attention projects ``roles`` from the block's un-normalised input (a layer converted
    from separate query and key/value inputs, cross-attention's, that normalises only one of them)."""

    def forward(self, x, positions, cache, layer, mask=None):
        both = torch.cat((self.attn_norm(x), x), dim=-1)
        out = type(self.attn).forward(_Reading(self.attn, roles), both, positions, cache, layer, mask)
        if getattr(self, "post_norms", False):
            out = self.attn_post_norm(out)
        x = x + self.drop(out)
        return x + self.drop(self.mlp(self.mlp_norm(x)))

    return forward


def _rewire_stream_reading(roles: tuple[str, ...]):
    def rewire(model) -> None:
        layers = _blocks(model)
        for block in layers:
            block.forward = types.MethodType(_stream_reading_forward(roles), block)

    return rewire


def _rewire_fused_stream(before_gain: bool):
    """Every norm but the first replaces the stream with its normalised value: a fused add-and-norm (norm(x, residual)
    giving the normalised sum and the sum) whose normalised sum is carried on as the residual."""

    def rewire(model) -> None:
        layers = _blocks(model)
        for i, block in enumerate(layers):
            carried = tuple(_without_gain(n) for n in (block.attn_norm, block.mlp_norm)) if before_gain else None
            block.forward = types.MethodType(_fused_stream_forward(i == 0, carried), block)

    return rewire


def _rewire_last_block(kind: str):
    def rewire(model) -> None:
        layers = _blocks(model)
        layers[-1].forward = types.MethodType(_block_forward(kind), layers[-1])

    return rewire


def _with_rope(forward, make, *, zeroed=()):
    """An attention ``forward`` run with the reference attention's ``rope`` answered by ``make(self, rope)``, made
    afresh for each call (``NotApplicable`` where the attention computes RoPE elsewhere); ``zeroed``: the attention's
    projections whose biases are zero during the call."""
    try:
        names = forward.__globals__["multihead_self_attention"].__globals__
        names["rope"]
    except (AttributeError, KeyError):
        raise NotApplicable("the attention computes RoPE elsewhere") from None

    def wrapped(self, x, positions, cache, layer, mask=None):
        rope = names["rope"]
        names["rope"] = make(self, rope)
        saved = [getattr(self, p).bias.detach().clone() for p in zeroed]
        with torch.no_grad():
            for p in zeroed:
                getattr(self, p).bias.zero_()
        try:
            return forward(self, x, positions, cache, layer, mask)
        finally:
            names["rope"] = rope
            with torch.no_grad():
                for p, bias in zip(zeroed, saved, strict=True):
                    getattr(self, p).bias.copy_(bias)

    return wrapped


def _rewire_attention(unfit: Callable, why: str, make, **options):
    """A ``rewire`` giving every layer's attention ``_with_rope(make)`` (``NotApplicable`` where ``unfit(attn)``)."""

    def rewire(model) -> None:
        attns = [block.attn for block in getattr(model, "layers", None) or ()]
        if not attns or any(unfit(a) for a in attns):
            raise NotApplicable(why)
        for attn in attns:
            attn.forward = types.MethodType(_with_rope(type(attn).forward, make, **options), attn)

    return rewire


def _rope_then_bias(self, rope):
    """The q and k biases added after RoPE, to each rotated tensor (q first, then k)."""
    d_head = self.config.d_head
    biases = iter([self.wq.bias.detach().clone(), self.wk.bias.detach().clone()])
    return lambda t, *a, **k: (
        rope(t, *a, **k) + next(biases).reshape(-1, 1, d_head)
    )  # [heads, 1, d] on [B, heads, T, d]


def _cos_only(self, rope):
    """``x * cos(angle)``: the mean of the rotations by the angle and by its negative (no table for those)."""
    return lambda t, at, *a, **k: (rope(t, at, *a, **k) + rope(t, -at, *a, **{**k, "table_size": None})) / 2


def _default_theta(which: int):
    """The ``which``-th RoPE call of each attention call (0: the queries, 1: the keys) at the default theta 10000."""

    def make(self, rope):
        calls = iter(range(2))
        return lambda t, at, theta, *a, **k: rope(t, at, 10000.0 if next(calls, None) == which else theta, *a, **k)

    return make


_qkv_bias_after_rope = _rewire_attention(
    lambda a: getattr(a, "theta", None) is None or getattr(a.wq, "bias", None) is None,
    "no query and key biases beside RoPE",
    _rope_then_bias,
    zeroed=("wq", "wk"),
)
_rope_cos_only = _rewire_attention(
    lambda a: getattr(a, "theta", None) is None or getattr(a.config, "rope_scaling", None),
    "no RoPE, or a scaled one (its dynamic length read from the positions)",
    _cos_only,
)


def _rope_default_theta(which: int):
    return _rewire_attention(
        lambda a: getattr(a, "theta", None) in (None, 10000.0),
        "no RoPE, or its theta is the default already",
        _default_theta(which),
    )


def _no_final_norm(model) -> None:
    model.final_norm = nn.Identity()


def _ids_shifted_right(model) -> None:
    """The model reads its ids shifted right by one, a 0 in front and the last id dropped (Trax's ShiftRight kept in a
    language model); through a cache it reads them as given (Trax's predict mode does not shift)."""
    forward = model.forward

    def shifted(ids, cache=None, **kwargs):
        if cache is None:
            ids = torch.cat((torch.zeros_like(ids[:, :1]), ids[:, :-1]), dim=1)
        return forward(ids, cache, **kwargs)

    model.forward = shifted


# a weightless norm's eps where none is passed: torch.nn.functional.rms_norm's (the dtype's eps), layer_norm's 1e-5
_DEFAULT_EPS = {"RMSNorm": None, "LayerNorm": 1e-5}


def _normalised_embeddings(kind: str, default_eps: bool, tokens: bool):
    """The stream starts normalised: a norm without weights (``kind``: the reference's ``RMSNorm`` or ``LayerNorm``
    class; at the config's norm_eps, or where ``default_eps`` at torch's default) on the embeddings before the first
    block (nanochat's parameter-free norm after the token embedding); ``tokens``: on the token embeddings alone,
    before gpt2's positions are added (their table's rows normalised), else on their sum."""

    def rewire(model) -> None:
        norm_class = getattr(sys.modules[type(model.final_norm).__module__], kind, None)
        if norm_class is None:
            raise NotApplicable(f"the reference has no {kind}")
        if tokens and model.pos_embeddings is None:
            raise NotApplicable("no position embeddings: the token embeddings are the stream")
        weight, eps = model.tok_embeddings.weight, model.config.norm_eps
        if default_eps:
            default = _DEFAULT_EPS[kind]
            if default == eps:
                raise NotApplicable("the config's norm_eps is the default")
            eps = torch.finfo(weight.dtype).eps if default is None else default
        norm = _without_gain(norm_class(model.config.d_model, eps)).to(weight)
        if tokens:
            table = nn.Embedding(*weight.shape, device=weight.device, dtype=weight.dtype)
            table.weight.copy_(norm(weight))  # each looked-up row normalised; a tied head keeps the parameter
            model.tok_embeddings = table
        else:
            model.drop = nn.Sequential(norm, model.drop)

    return rewire


def _toggle_embedding_scale(model) -> None:
    config = model.config
    if not any(f.name == "embed_scale" for f in dataclasses.fields(config)):
        raise NotApplicable("the reference has no embedding scale")
    model.config = dataclasses.replace(config, embed_scale=not config.embed_scale)


# ----------------------------------------------------------------------------------------- the weights


def _names(state_dict: dict, suffix: str) -> list[str]:
    return [k for k in state_dict if k.endswith(suffix)]


def _transposed(suffix: str):
    """The square canonical weights ending ``suffix`` transposed (a non-square one would not load)."""

    def transform(state_dict: dict, config) -> dict:
        names = [k for k in _names(state_dict, suffix) if state_dict[k].dim() == 2]
        if not names or any(state_dict[k].shape[0] != state_dict[k].shape[1] for k in names):
            raise NotApplicable(f"{suffix} is not square")
        return {**state_dict, **{k: state_dict[k].t().contiguous() for k in names}}

    return transform


def _transposed_attention(state_dict: dict, config) -> dict:
    """Every attention projection transposed (where all four are square: MHA with d_head * n_heads = d_model)."""
    out = dict(state_dict)
    for suffix in ("attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight"):
        out = _transposed(suffix)(out, config)
    return out


def _swapped(a: str, b: str):
    """The canonical weights (and biases) of projections ``a`` and ``b`` exchanged in every layer."""

    def transform(state_dict: dict, config) -> dict:
        out = dict(state_dict)
        pairs = [(k, k.replace(f"attn.{a}.", f"attn.{b}.")) for k in state_dict if f"attn.{a}." in k]
        if not pairs or any(k2 not in state_dict or state_dict[k1].shape != state_dict[k2].shape for k1, k2 in pairs):
            raise NotApplicable(f"{a} and {b} differ in shape")
        for k1, k2 in pairs:
            out[k1], out[k2] = state_dict[k2], state_dict[k1]
        return out

    return transform


def _scaled_positions(factor: Callable[[int], float]):
    """The learned position embeddings multiplied by ``factor(d_model)`` (0: never added)."""

    def transform(state_dict: dict, config) -> dict:
        if "pos_embeddings.weight" not in state_dict:
            raise NotApplicable("no learned position embeddings")
        w = state_dict["pos_embeddings.weight"]
        return {**state_dict, "pos_embeddings.weight": w * factor(w.shape[-1])}

    return transform


def _every_layer_as(which: str):
    """Every block's canonical weights replaced by one block's (``"first"`` or ``"last"``): one block module
    repeated (``[Block()] * n_layers``), or a loader writing one layer's weights into every block."""

    def transform(state_dict: dict, config) -> dict:
        layers = sorted({int(k.split(".")[1]) for k in state_dict if k.startswith("layers.")})
        if len(layers) < 2:
            raise NotApplicable("a single block")
        source = f"layers.{layers[0] if which == 'first' else layers[-1]}."
        out = dict(state_dict)
        for key in state_dict:
            if key.startswith("layers."):
                out[key] = state_dict[source + key.split(".", 2)[2]]
        return out

    return transform


def _not_head_major(with_output: bool):
    """q, k, v rows (and with ``with_output`` wo's columns) read as ``[d_head, heads]`` instead of ``[heads,
    d_head]``: the loader's (or the head split's) view puts the channel before the head."""

    def permute_rows(w: torch.Tensor, heads: int, d_head: int) -> torch.Tensor:
        return w.reshape(d_head, heads, *w.shape[1:]).transpose(0, 1).reshape(w.shape).contiguous()

    def transform(state_dict: dict, config) -> dict:
        n_heads, n_kv, d_head = _heads(config)
        if d_head < 2 or n_heads < 2:
            raise NotApplicable("one head or one channel: every order is head-major")
        out = dict(state_dict)
        for k, w in state_dict.items():
            for proj, heads in (("wq", n_heads), ("wk", n_kv), ("wv", n_kv)):
                if f"attn.{proj}." in k and heads > 1:
                    out[k] = permute_rows(w, heads, d_head)
            if with_output and k.endswith("attn.wo.weight"):
                out[k] = permute_rows(w.t(), n_heads, d_head).t().contiguous()
        return out

    return transform


def _rope_rows_permuted(to: str):
    """The q and k rows of each head permuted at load as for the other RoPE pairing while the model rotates with its
    declared one: a converter's permute (Hugging Face's halves to Meta's interleaved rows, ``to="interleaved"``, or
    back) applied to rows that already suit the model's rotation. Toward the declared pairing itself the permute only
    reorders the rotated channels, the same scores as the other pairing (the rope_style knob), so it is not offered."""

    def rewire(model) -> None:
        attns = [block.attn for block in getattr(model, "layers", None) or ()]
        if not attns or any(getattr(a, "theta", None) is None for a in attns):
            raise NotApplicable("no RoPE")
        for attn in attns:
            d_head = attn.config.d_head
            if attn.rope_style == to or d_head < 4 or d_head % 2:
                raise NotApplicable("the permute toward the declared pairing is the rope_style knob's")
            split = (2, d_head // 2) if to == "interleaved" else (d_head // 2, 2)  # row 2i <- i, 2i + 1 <- d/2 + i
            with torch.no_grad():
                for proj in (attn.wq, attn.wk):
                    for p in (proj.weight, proj.bias):
                        if p is not None:
                            heads = p.shape[0] // d_head
                            p.copy_(p.reshape(heads, *split, *p.shape[1:]).transpose(1, 2).reshape(p.shape))

    return rewire


def _fused_qkv_per_head(state_dict: dict, config) -> dict:
    """A fused ``[wq; wk; wv]`` matrix read per head (``[heads, 3, d_head]``, GPT-NeoX's layout) instead of as
    the three projections one after the other."""
    n_heads, n_kv, d_head = _heads(config)
    if n_kv != n_heads:
        raise NotApplicable("grouped keys: no per-head fused layout of equal parts")
    out = dict(state_dict)
    for kind in ("weight", "bias"):
        for q_name in _names(state_dict, f"attn.wq.{kind}"):
            k_name, v_name = q_name.replace(".wq.", ".wk."), q_name.replace(".wq.", ".wv.")
            fused = torch.cat([state_dict[q_name], state_dict[k_name], state_dict[v_name]])
            parts = fused.reshape(n_heads, 3, d_head, *fused.shape[1:])
            for i, name in enumerate((q_name, k_name, v_name)):
                out[name] = parts[:, i].reshape(state_dict[name].shape).contiguous()
    return out


# ----------------------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Wiring:
    """One wiring choice of the model changed: ``weights`` transforms the canonical weights before they are
    loaded, ``rewire`` changes the built module in place; either may raise ``NotApplicable``."""

    name: str
    code: str
    summary: str
    fix: str
    weights: Callable | None = None
    rewire: Callable | None = None
    group: str | None = None  # wirings of one mistake in several forms (one applies to llama, another to gpt2): a
    # search that remembers what fitted a test's first case offers the whole group again on its other cases


PRE_NORM = "x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))"

WIRINGS = (
    Wiring(
        "no_attn_residual",
        "knob:missing_residual",
        "the attention branch has no residual connection: its output replaces the stream (x = attn(norm(x)))",
        f"add the branch to the stream it read: {PRE_NORM}",
        rewire=_rewire_blocks("no_attn_residual"),
    ),
    Wiring(
        "no_mlp_residual",
        "knob:missing_residual",
        "the MLP branch has no residual connection: its output replaces the stream (x = mlp(norm(x)))",
        f"add the branch to the stream it read: {PRE_NORM}",
        rewire=_rewire_blocks("no_mlp_residual"),
    ),
    Wiring(
        "last_block_no_mlp_residual",
        "knob:missing_residual",
        "the final norm reads the last block's MLP output alone: the residual stream is dropped after the last "
        "layer (a fused add-and-norm, norm(x, residual), called without the residual at the end), while every other "
        "residual is added",
        "the final norm normalises the whole stream, the last MLP output added to the residual: final_norm(x + "
        "mlp(norm(x))) (with a fused norm, pass the carried residual to the final norm too)",
        rewire=_rewire_last_block("no_mlp_residual"),
    ),
    Wiring(
        "mlp_residual_from_input",
        "knob:missing_residual",
        "the MLP's residual adds to the block's input, not to the stream after attention: the attention output "
        "only feeds the MLP (x + mlp(norm(x + attn(norm(x)))))",
        f"add the MLP branch to the stream after the attention residual: {PRE_NORM}",
        rewire=_rewire_blocks("mlp_residual_from_input"),
    ),
    Wiring(
        "post_ln",
        "knob:norm_placement",
        "the blocks are post-LN, x = norm(x + f(x)), instead of pre-LN, x = x + f(norm(x))",
        f"normalise each branch's input, not the sum: {PRE_NORM}",
        rewire=_rewire_blocks("post_ln"),
    ),
    Wiring(
        "norm_on_stream",
        "knob:norm_placement",
        "the norm is applied to the residual stream itself (x = norm(x); x = x + f(x)), not only to the branch "
        "input, so the un-normalised stream is lost",
        f"keep the stream and normalise a copy for the branch: {PRE_NORM}",
        rewire=_rewire_blocks("norm_on_stream"),
    ),
    *(
        Wiring(
            f"norm_on_{branch}_stream",
            "knob:norm_placement",
            f"the {branch} branch's residual starts from the normalised stream: x = {norm}(x); x = x + {branch}(x), "
            f"so the un-normalised stream is lost at every layer (the other branch is right)",
            f"keep the stream and normalise a copy for the branch: {PRE_NORM}",
            rewire=_rewire_blocks(f"norm_on_{branch}_stream"),
        )
        for branch, norm in (("attn", "attn_norm"), ("mlp", "mlp_norm"))
    ),
    *(
        Wiring(
            f"{'_'.join(roles)}_from_the_unnormalised_stream",
            "knob:norm_placement",
            f"the attention's {what} projected from the block's un-normalised input (the residual stream) while "
            f"{rest} read attn_norm(x): a layer written with separate query and key/value inputs that normalises "
            "only one of them",
            "project q, k and v all from the one normalised input: h = attn_norm(x); q, k, v = h wq^T, h wk^T, h wv^T",
            rewire=_rewire_stream_reading(roles),
        )
        for roles, what, rest in (
            (("wk", "wv"), "keys and values are", "the queries"),
            (("wq",), "queries are", "the keys and values"),
            (("wv",), "values are", "the queries and keys"),
            (("wq", "wk"), "queries and keys are", "the values"),
            (("wk",), "keys are", "the queries and values"),
            (("wq", "wv"), "queries and values are", "the keys"),
        )
    ),
    Wiring(
        "norm_on_fused_stream",
        "knob:norm_placement",
        "each fused add-and-norm hands on its normalised output as the residual stream (norm(x + f) for x + f): every "
        "norm but the first replaces the stream with its normalised value, so the un-normalised stream is lost",
        "carry the sum (the fused norm's residual output, x + f) as the stream and feed the normalised one to the "
        f"branch only: {PRE_NORM}",
        rewire=_rewire_fused_stream(before_gain=False),
    ),
    Wiring(
        "norm_on_fused_stream_before_gain",
        "knob:norm_placement",
        "each fused add-and-norm hands on its normalised sum before the gain as the residual stream (x / rms(x) for x "
        "+ f, the norm's weight applied to the branch input only): every norm but the first replaces the stream, so "
        "the un-normalised stream is lost",
        "carry the sum (the fused norm's residual output, x + f, taken before normalising) as the stream and feed the "
        f"normalised one to the branch only: {PRE_NORM}",
        rewire=_rewire_fused_stream(before_gain=True),
    ),
    *(
        Wiring(
            f"post_norm_after_{branch}_residual",
            "knob:norm_placement",
            f"the {branch} branch's post-norm (post_norms) normalises the sum after the residual add, x = "
            f"{branch}_post_norm(x + {branch}(norm(x))), instead of the branch's output before it",
            f"x = x + {branch}_post_norm({branch}({branch}_norm(x))): the post-norm on the branch, then the residual",
            rewire=_rewire_blocks(f"post_norm_after_{branch}_residual"),
        )
        for branch in ("attn", "mlp")
    ),
    Wiring(
        "qkv_bias_after_rope",
        "knob:qkv_bias",
        "the query and key biases are added after RoPE, to the rotated projections (rope(x wq^T) + bq), so they "
        "are not rotated with them",
        "add bq, bk to x wq^T, x wk^T before RoPE: rope(x wq^T + bq), rope(x wk^T + bk)",
        rewire=_qkv_bias_after_rope,
    ),
    *(
        Wiring(
            f"{role}_default_theta",
            "knob:rope_theta",
            f"the {role}' RoPE turns at the default theta 10000, not the config's rope_theta (the {other}' does): "
            f"a rotary layer built for the {role} without the theta passed on keeps its default",
            "pass rope_theta to the RoPE of the queries and of the keys alike",
            rewire=_rope_default_theta(which),
        )
        for which, role, other in ((0, "queries", "keys"), (1, "keys", "queries"))
    ),
    Wiring(
        "rope_cos_only",
        "knob:rope_table",
        "RoPE multiplies each query and key channel by cos(angle) and never mixes in its pair's sine term: the "
        "rotation's sine is lost (a complex frequency buffer cast to a real dtype by model.to(dtype) keeps only its "
        "real part, with a warning that the imaginary part is discarded)",
        "rotate each pair by its angle, (x0 cos - x1 sin, x0 sin + x1 cos); keep a complex table out of the module's "
        "buffers (or re-create it in the right dtype after .to), or store cos and sin as real tables",
        rewire=_rope_cos_only,
    ),
    Wiring(
        "ids_shifted_right",
        "knob:label_shift",
        "the model reads its ids shifted right by one (a 0 in front, the last id dropped, as Trax's ShiftRight or a "
        "decoder_start_token does): the logits at position t see the tokens before t, never token t itself",
        "feed the ids as given: the logits at t predict token t + 1 from tokens 0..t (shifting belongs to the "
        "targets, ids[:, 1:], never to the model's input)",
        rewire=_ids_shifted_right,
    ),
    Wiring(
        "no_final_norm",
        "knob:norm_placement",
        "the LM head reads the un-normalised residual stream: the final norm is skipped",
        "logits = lm_head(final_norm(x)) after the last block",
        rewire=_no_final_norm,
    ),
    Wiring(
        "parallel",
        "knob:parallel_blocks",
        "attention and the MLP run in parallel on the same input (GPT-J style, x + attn(norm1(x)) + "
        "mlp(norm2(x))) instead of one after the other",
        f"the MLP reads the stream after the attention residual: {PRE_NORM}",
        rewire=_rewire_blocks("parallel"),
    ),
    Wiring(
        "parallel_shared_norm",
        "knob:parallel_blocks",
        "attention and the MLP run in parallel on one normalised input (GPT-J style, h = attn_norm(x); "
        "x + attn(h) + mlp(h)) instead of one after the other",
        f"the MLP reads the stream after the attention residual, through mlp_norm: {PRE_NORM}",
        rewire=_rewire_blocks("parallel_shared_norm"),
    ),
    Wiring(
        "embedding_scale",
        "knob:embed_scale",
        "the token embeddings are scaled by sqrt(d_model) where the configuration does not scale them (or not "
        "scaled where it does: embed_scale)",
        "multiply the token embeddings by sqrt(d_model) only with embed_scale (Gemma); llama and gpt2 use them "
        "as they are",
        rewire=_toggle_embedding_scale,
    ),
    *(
        Wiring(
            f"embeddings_{name}{'_at_the_default_eps' if default else ''}{'_before_the_positions' if tokens else ''}",
            "knob:norm_placement",
            f"the {'token embeddings are' if tokens else 'embeddings are'} normalised before "
            f"{'the positions are added' if tokens else 'the first block'} ({what} without weights"
            f"{', at torch' + chr(39) + 's default eps' if default else ''}; nanochat's norm after the token "
            "embedding): the residual stream starts at unit scale",
            "feed the embeddings to the first block as they are: x = tok_embeddings(ids) (+ pos_embeddings); only "
            "the blocks' own norms normalise, each branch's input",
            rewire=_normalised_embeddings(kind, default, tokens),
            group="embeddings_normalised",
        )
        for name, what, kind in (
            ("rms_normalised", "an RMS norm", "RMSNorm"),
            ("layer_normalised", "a layer norm", "LayerNorm"),
        )
        for default in (False, True)
        for tokens in (False, True)
    ),
    Wiring(
        "position_embeddings_scaled_down",
        "knob:embed_scale",
        "the learned position embeddings are scaled by d_model ** -0.5 before they are added (x-transformers' "
        "AbsolutePositionalEmbedding scale), where gpt2 adds them as they are",
        "add the position embeddings unscaled: x = tok_embeddings(ids) + pos_embeddings(positions)",
        weights=_scaled_positions(lambda d: d**-0.5),
    ),
    Wiring(
        "position_embeddings_scaled_up",
        "knob:embed_scale",
        "the learned position embeddings are scaled by sqrt(d_model) before they are added, where gpt2 adds them "
        "as they are",
        "add the position embeddings unscaled: x = tok_embeddings(ids) + pos_embeddings(positions)",
        weights=_scaled_positions(lambda d: d**0.5),
    ),
    Wiring(
        "no_position_embeddings",
        "knob:embed_scale",
        "the learned position embeddings are never added: the token embeddings alone enter the first block",
        "add them: x = tok_embeddings(ids) + pos_embeddings(positions), positions from the cache's length on",
        weights=_scaled_positions(lambda d: 0.0),
    ),
    Wiring(
        "transposed_attention",
        "knob:weight_layout",
        "the attention projections are used as [in, out]: the canonical [out, in] weights are transposed at load "
        "(or applied as x @ W instead of x @ W.T)",
        "canonical Linear weights are [out_features, in_features]: y = x @ W.T (load them as they are)",
        weights=_transposed_attention,
    ),
    *(
        Wiring(
            f"transposed_{proj}",
            "knob:weight_layout",
            f"{proj} is used as [in, out]: the canonical [out, in] weight is transposed at load (or applied as "
            "x @ W instead of x @ W.T)",
            f"load {proj} as it is and apply it as x @ W.T",
            weights=_transposed(f"attn.{proj}.weight"),
        )
        for proj in ("wq", "wk", "wv", "wo")
    ),
    *(
        Wiring(
            f"every_layer_the_{which}",
            "knob:layer_weights",
            f"every block computes with the {which} block's weights: one block module repeated ([Block()] * "
            f"n_layers shares one module), or the loader writes layer {index}'s weights into every block",
            "build a new block per layer (ModuleList(Block() for _ in range(n_layers))) and load layers.{i}.* into "
            "block i",
            weights=_every_layer_as(which),
        )
        for which, index in (("first", "0"), ("last", "n_layers - 1"))
    ),
    Wiring(
        "wq_wk_swapped",
        "knob:qkv_layout",
        "wq and wk are swapped at load (the queries are computed with the key projection and the keys with the "
        "query projection)",
        "load attn.wq into the query projection and attn.wk into the key projection (a fused matrix is [q; k; v])",
        weights=_swapped("wq", "wk"),
    ),
    Wiring(
        "wk_wv_swapped",
        "knob:qkv_layout",
        "wk and wv are swapped at load (a fused qkv matrix split in the order q, v, k)",
        "split a fused qkv matrix as [q; k; v] and load attn.wk into the keys, attn.wv into the values",
        weights=_swapped("wk", "wv"),
    ),
    Wiring(
        "wq_wv_swapped",
        "knob:qkv_layout",
        "wq and wv are swapped at load (a fused qkv matrix split in the order v, k, q)",
        "split a fused qkv matrix as [q; k; v] and load attn.wq into the queries, attn.wv into the values",
        weights=_swapped("wq", "wv"),
    ),
    Wiring(
        "qkv_not_head_major",
        "knob:qkv_layout",
        "the q, k, v rows are read as [d_head, n_heads] instead of head-major [n_heads, d_head] (a view that puts "
        "the channel before the head)",
        "canonical rows are head-major: view(n_heads, d_head, d_model), or view(B, T, n_heads, d_head) on the output",
        weights=_not_head_major(with_output=False),
    ),
    Wiring(
        "qkvo_not_head_major",
        "knob:qkv_layout",
        "the q, k, v rows and wo's columns are read as [d_head, n_heads] instead of head-major [n_heads, d_head]",
        "canonical rows (and wo's columns) are head-major: view(n_heads, d_head, ...)",
        weights=_not_head_major(with_output=True),
    ),
    *(
        Wiring(
            f"rope_rows_permuted_to_{to}",
            "knob:qkv_layout",
            f"the q and k rows of each head are permuted at load for {to} RoPE pairs ({how}) while the model rotates "
            f"with the declared {other} pairing: a converter's permute for the other rotary type (llama.cpp's NORMAL "
            "and NEOX, Meta's and Hugging Face's layouts)",
            f"rotate with the pairing the rows were permuted for ({to}), or load wq and wk as the canonical rows for "
            f"the declared {other} style",
            rewire=_rope_rows_permuted(to),
        )
        for to, other, how in (
            ("interleaved", "half", "row 2i from row i, row 2i + 1 from row d_head/2 + i"),
            ("half", "interleaved", "row i from row 2i, row d_head/2 + i from row 2i + 1"),
        )
    ),
    Wiring(
        "fused_qkv_per_head",
        "knob:qkv_layout",
        "a fused qkv matrix is split per head ([n_heads, 3, d_head], GPT-NeoX's layout) instead of as [q; k; v]",
        "the fused matrix is the three canonical projections one after the other: q, k, v = W.split(...)",
        weights=_fused_qkv_per_head,
    ),
)

# Not offered: dropout left active in eval mode (a random output cannot equal one computed once; the mode
# tests observe it), and the head on the un-normalised stream, which is ``no_final_norm``.


def wired_build(build_model, wiring: Wiring, applied: list):
    """``build_model`` (the reference's) with ``wiring``: the canonical weights transformed before loading, the
    built module rewired. ``applied`` collects one entry per model built this way."""

    def build(config, state_dict=None, *args, **kwargs):
        if wiring.weights is not None:
            if state_dict is None:
                raise NotApplicable("no canonical weights to lay out")
            state_dict = wiring.weights(dict(state_dict), config)
        model = build_model(config, state_dict, *args, **kwargs)
        if wiring.rewire is not None:
            wiring.rewire(model)
        applied.append(wiring.name)
        return model

    return build


@contextlib.contextmanager
def _building_with(reference, build):
    """``reference`` (a local subject) answering ``build_model`` with ``build``. Models are built through the
    subject (``model_ops.build``) and nothing in the reference calls ``build_model`` itself, so only the subject's
    own binding changes: ``Subject.substituted`` would also walk every loaded module to rebind the name there."""
    replaced = getattr(reference, "_replaced", None)
    if not isinstance(replaced, dict):
        with reference.substituted({"build_model": build}):
            yield
        return
    reference._replaced = {**replaced, "build_model": build}
    try:
        yield
    finally:
        reference._replaced = replaced


def wiring_variant(name: str, compute):
    """The ``Variant`` of the wiring named ``name`` for a check computing ``compute(reference, *args)``: for a test
    that offers one wiring without the whole model search (``Spec.check(model_knobs=True)``)."""
    from .variant import Variant

    wiring = next((w for w in WIRINGS if w.name == name), None)
    if wiring is None:
        raise ValueError(f"unknown wiring {name!r}; known: {[w.name for w in WIRINGS]}")
    return Variant(wiring.code, wiring.summary, wiring.fix, lambda ref, *a: run_wired(compute, ref, a, wiring))


def run_wired(compute, reference, args, wiring: Wiring):
    """``compute(reference, *args)`` with every model it builds wired as ``wiring`` (``NotApplicable`` when it
    builds none, so that an unchanged output is never offered as this wiring's)."""
    applied: list = []
    build = wired_build(reference.obj.build_model, wiring, applied)
    with torch.no_grad(), _building_with(reference, build):
        out = compute(reference, *args)
    if not applied:
        raise NotApplicable("the computation builds no model")
    return out
