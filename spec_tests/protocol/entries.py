"""One entry per protocol name: every fact the suite holds about a name, in one place (PyTorch's OpInfo).

A table keyed by protocol names elsewhere is a view of these entries (``COMPONENT_OF``, ``MAY_CALL``,
``SUBSTITUTABLE`` below; ``KNOB_FAMILIES``, ``CATALOG_GROUPS``, ``REFERENCE_ONLY``, ...), computed here or
by its consumer, and ``test_precision.py`` reads its inputs from them as ``@ops(op_db)`` reads OpInfos.
``tests/test_protocol_entries.py`` checks that every name has exactly one entry and that no other module
of ``spec_tests/`` keys a dict literal by protocol names.

This package imports nothing of the suite: an entry names what lives in the harness by string (a knob
family is the name of its function in ``spec_tests/harness/diagnosis/knobs.py``, resolved there; a catalog
group is a tag of ``spec_tests/bugs``). A precision sample is a function of the suite's input helpers
(``spec_tests.inputs``, bound to a device), its sizes ``S`` and the device, passed in by the test.

Tables keyed by protocol names that stay where they are, and why:

- ``BUG_CLASSES`` (``spec_tests/bug_classes.py``) and ``CLASS_CODES`` (``harness/diagnosis/catalog.py``)
  are keyed by bug class; some classes share a protocol name's spelling (``rmsnorm``, ``causal_mask``),
  but a class is not a name (``rope_frequency``, ``top_k``, ``precision``).
- ``model_knobs.PARTS`` is the order in which diagnosis searches the model's components (the first knob
  that fits is reported), not a property of each name; ``consequences.COMPOSABLE`` and ``UNFUSE`` belong
  to the consequence logic, which issue 22 gives one home of its own.
- the protocol clauses with their edge cases (``docs/protocol-clauses.toml``, read by
  ``tools/protocol_map.py``) and ``spec_adapters/cs336.py``'s name map are data of a tool and of an
  adapter, outside the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Precision sample: (inputs helper bound to the device, sizes S, device) -> (args, kwargs) in float64.
Sample = Callable[..., tuple[tuple, dict]]


@dataclass(frozen=True)
class Entry:
    """What the suite knows about one protocol name.

    - ``component``: the test module and rubric entry the name belongs to (``test_<component>.py``).
    - ``calls``: the protocol names an implementation of it may call (directly or not), where a failing test
      may trace back to; ``None``: the name is absent from ``MAY_CALL`` (it calls no protocol name).
      ``calls_model_parts``: it may also call every model part (``may_call`` is the union).
    - ``model_part``: a component the model is built from (``MODEL_PARTS``).
    - ``substitutable``: the implementation's version can stand in for the reference's inside the reference
      (a function of tensors and numbers; model-bound names, built models, caches and optimizers cannot be
      swapped): the composition that decides consequences (``harness/judging/consequences.py``).
    - ``tolerance``: the math tolerance kind its own tests use (``harness/judging/tolerances.py``), where
      ``test_precision.py`` judges the math before the precision.
    - ``precision_sample``: float64 inputs for ``test_float64_computed_in_float64`` (see ``Sample``); the
      names that have one are that test's parameters, in protocol order.
    - ``reference_only``: the reference's keyword-only options that the protocol does not have (an
      implementation is never called with one). Every keyword of the reference's function is
      the protocol's (its row in ``docs/protocol.md`` or an amendment), reference-only, or deliberately
      allowed: ``tests/test_protocol_entries.py`` (``ALLOWED_UNNAMED``) fails on one nobody lists.
    - ``amended_keywords``: keywords its signature row in ``docs/protocol.md`` lacks but an amendment gives it:
      keyword -> the amendment's number (whose text names both; ``tests/test_protocol_entries.py`` checks).
    - ``style_keyword``: the reference's option that selects the RoPE pairing (amendment 6).
    - ``catalog_groups``: the bug-catalog tags of the checks that judge it, besides its own name.
    - ``knob_family``: the name of its knob-family function in ``harness/diagnosis/knobs.py``.
    - ``any_leading_dims``: its protocol shapes are ``[..., d]`` (crash diagnosis says so); ``core_rank``: how many
      dims its first input keeps with no leading dims at all (``[d]`` 1, rope's ``[T, d_head]`` 2, attention's
      per-head ``[H, T, d]`` 3).
    - ``batch_rows``: its first input has a fixed rank whose dim 0 is the batch (``multihead_self_attention``'s
      ``[B, T, d_model]``): each row is computed alone, so a failing output's rows are tried alone
      (``diagnosis/rows.py``), as a name of any leading dims' are.
    - ``fixed_rank``: the rank of its first input where the protocol fixes it (``repeat_kv``'s ``[B, Hkv, T, d]``:
      4); the composition that decides consequences hands it that rank (leading dims merged into the first).
    - ``nan_rows_unspecified``: rows with no allowed key are unspecified (NaN in these computations).
    - ``none_means``: its optional arguments whose ``None`` has an equivalent value the protocol states
      (``positions=None`` is ``arange(T)``, ``mask=None`` no mask, ``bias=None`` a zero bias,
      ``max_grad_norm=None`` no clipping, ``generator=None`` a generator of its own, ``top_k=None`` all ``V``
      tokens, ``top_p=None`` the whole mass, ``device=None`` the default device, ``dtype=None`` torch's default
      dtype): crash diagnosis passes
      that value instead, to tell an unhandled ``None`` from other triggers.
    - ``speed_only``: its boolean arguments that the protocol says change speed, never the result (``generate``'s
      ``use_cache``): crash diagnosis tries the other value, to tell a crash of the faster path.
    - ``windowed``: it cuts its ``data`` into the protocol's consecutive windows of ``context_length`` (one more
      token each, sharing one; the last shorter) and takes them ``batch_size`` at a time (``evaluate``): crash
      diagnosis relates the data's length and the batch size to the number of windows.
    - ``activation_fit``: how its activation is measured alone and fitted when it fails
      (``harness/diagnosis/activation_fit.py``: ``"tanh_gelu"`` identity weights around the tanh GELU,
      ``"gated_silu"`` identity weights around SiLU's gate, ``"plain_silu"`` the function itself).
    - ``constant_fit``: which constant of its computation is fitted to a failing output
      (``harness/diagnosis/constant_fit.py``: ``"sdpa_scale"``, ``"flash_scale"``, ``"mha_scale"`` the
      attention scores' scale in each, ``"rope_rotation"``
      RoPE's rotation measured on unit vectors).
    - ``shift_invariant``: its output is unchanged when a constant is added to each row of its first input (the
      logits, along the last axis: a softmax's): an overflow there is measured by subtracting each row's max
      (``harness/diagnosis/shifted.py``).
    - ``capability``: the protocol-v2 capability that brings the name (amendment 28's ``moe_mlp``): only an
      implementation that declares it need define it (one that lacks the name is "not provided" in its tests).
    - ``loaded_as``: ``(family, names)``: the canonical names (layer 0, without its prefix) of its positional
      arguments that are a model's weights, ``None`` for the others: its failure is a consequence of the loading
      where it equals the reference's on the weights the implementation's own round trip gives back
      (``spec_tests/round_trip.py``: glue that converts the weights it is given with the model's loader).
    """

    name: str
    component: str
    calls: tuple[str, ...] | None = None
    calls_model_parts: bool = False
    model_part: bool = False
    substitutable: bool = False
    tolerance: str | None = None
    precision_sample: Sample | None = None
    reference_only: frozenset[str] = frozenset()
    style_keyword: str | None = None
    catalog_groups: tuple[str, ...] = ()
    knob_family: str | None = None
    any_leading_dims: bool = False
    batch_rows: bool = False  # a fixed rank whose dim 0 is the batch: each row computed alone all the same
    core_rank: int = 1
    fixed_rank: int | None = None
    nan_rows_unspecified: bool = False
    none_means: tuple[str, ...] = ()
    speed_only: tuple[str, ...] = ()
    windowed: bool = False
    capability: str | None = None
    loaded_as: tuple[str, tuple[str | None, ...]] | None = None
    activation_fit: str | None = None
    constant_fit: str | None = None
    shift_invariant: bool = False
    amended_keywords: dict[str, int] = field(default_factory=dict)

    @property
    def may_call(self) -> tuple[str, ...] | None:
        """``calls``, then every model part where ``calls_model_parts``; None where it calls no protocol name."""
        if self.calls is None:
            return None
        return self.calls + (MODEL_PARTS if self.calls_model_parts else ())


# ---------------------------------------------------------------------------------------------
# precision samples (seeds fixed: each tensor is the same whichever sample asks for it)


def _x(i, S):
    """[B, T, d_model]"""
    return i.randn(S.B, S.T, S.d_model, seed=91)


def _per_head(i, S):
    """q, k, v: [B, H, T, D_HEAD] each"""
    return [i.per_head(S.B, S.H, S.T, S.D_HEAD, seed=92 + k) for k in range(3)]


def _causal(i, S, device):
    """[T, T] boolean, True where a query may see a key"""
    return (i.positions(S.T, start=0)[None, :] <= i.positions(S.T, start=0)[:, None]).to(device)


def _mha_weights(i, S):
    """wq, wk, wv, wo: [d_model, d_model] each"""
    return [i.fan_in_weight(S.d_model, S.d_model, seed=95 + k) for k in range(4)]


def _swiglu_sample(i, S, device):
    w1 = i.fan_in_weight(S.D_FF, S.d_model, seed=101)
    w3 = i.fan_in_weight(S.D_FF, S.d_model, seed=102)
    return (_x(i, S), w1, w3, i.fan_in_weight(S.d_model, S.D_FF, seed=103)), {}


def _gelu_mlp_sample(i, S, device):
    w_in, b_in = i.fan_in_weight(S.D_FF, S.d_model, seed=104), i.randn(S.D_FF, seed=105)
    w_out, b_out = i.fan_in_weight(S.d_model, S.D_FF, seed=106), i.randn(S.d_model, seed=107)
    return (_x(i, S), w_in, b_in, w_out, b_out), {}


# ---------------------------------------------------------------------------------------------
# the entries, in protocol order (components, sampling, model, training)

_FUSED = frozenset({"fused"})

ENTRIES: tuple[Entry, ...] = (
    # ------------------------------------------------------------------ primitives
    Entry(
        "linear",
        "primitives",
        model_part=True,
        substitutable=True,
        tolerance="matmul",
        precision_sample=lambda i, S, device: ((_x(i, S), i.weight(S.D_FF, S.d_model, seed=96)), {}),
        knob_family="_linear",
        any_leading_dims=True,
        none_means=("bias",),
    ),
    Entry(
        "embedding", "primitives", model_part=True, substitutable=True, any_leading_dims=True, knob_family="_embedding"
    ),
    Entry(
        "softmax",
        "primitives",
        model_part=True,
        substitutable=True,
        tolerance="pointwise",
        precision_sample=lambda i, S, device: ((i.randn(S.B, S.T, S.V, seed=97, scale=3.0),), {"dim": -1}),
        knob_family="_softmax",
        any_leading_dims=True,
        shift_invariant=True,
    ),
    Entry(
        "silu",
        "primitives",
        model_part=True,
        substitutable=True,
        tolerance="pointwise",
        precision_sample=lambda i, S, device: ((i.randn(S.B, S.T, S.D_FF, seed=98, scale=4.0),), {}),
        reference_only=_FUSED,
        knob_family="_silu_family",
        any_leading_dims=True,
        activation_fit="plain_silu",
    ),
    # ------------------------------------------------------------------ norms
    Entry(
        "rmsnorm",
        "norms",
        model_part=True,
        substitutable=True,
        tolerance="matmul",
        precision_sample=lambda i, S, device: ((_x(i, S), i.norm_weight(S.d_model, seed=99)), {}),
        knob_family="_rmsnorm",
        any_leading_dims=True,
    ),
    Entry(
        "layernorm",
        "norms",
        model_part=True,
        substitutable=True,
        tolerance="matmul",
        precision_sample=lambda i, S, device: (
            (_x(i, S), i.norm_weight(S.d_model, seed=99), i.randn(S.d_model, seed=100)),
            {},
        ),
        knob_family="_layernorm",
        any_leading_dims=True,
    ),
    # ------------------------------------------------------------------ mlp
    Entry(
        "swiglu",
        "mlp",
        calls=("linear", "silu"),
        model_part=True,
        substitutable=True,
        tolerance="matmul",
        precision_sample=_swiglu_sample,
        reference_only=_FUSED,
        knob_family="_swiglu",
        any_leading_dims=True,
        activation_fit="gated_silu",
        loaded_as=("llama", (None, "mlp.w_gate.weight", "mlp.w_up.weight", "mlp.w_down.weight")),
    ),
    Entry(
        "gelu_mlp",
        "mlp",
        calls=("linear",),
        model_part=True,
        substitutable=True,
        tolerance="matmul",
        precision_sample=_gelu_mlp_sample,
        knob_family="_gelu_mlp",
        any_leading_dims=True,
        activation_fit="tanh_gelu",
        loaded_as=("gpt2", (None, "mlp.w_fc.weight", "mlp.w_fc.bias", "mlp.w_proj.weight", "mlp.w_proj.bias")),
    ),
    Entry(
        "moe_mlp",  # protocol v2 (moe, amendment 28): Mixtral's sparse mixture of SwiGLU experts
        "mlp",
        calls=("linear", "silu", "swiglu", "softmax"),
        model_part=True,
        substitutable=True,
        tolerance="matmul",
        knob_family="_moe_mlp",
        any_leading_dims=True,
        capability="moe",
    ),
    # ------------------------------------------------------------------ positions
    Entry(
        "rope",
        "positions",
        model_part=True,
        substitutable=True,
        tolerance="positions",
        precision_sample=lambda i, S, device: ((_per_head(i, S)[0], i.scattered_positions(S.T, seed=108)), {}),
        reference_only=frozenset({"style", "table_size"}),
        style_keyword="style",
        knob_family="_rope_family",
        any_leading_dims=True,
        core_rank=2,
        amended_keywords={"scaling": 20},
        constant_fit="rope_rotation",
    ),
    Entry(
        "sinusoidal_positions",
        "positions",
        model_part=True,
        substitutable=True,
        knob_family="_sinusoidal",
        none_means=("dtype",),
        amended_keywords={"dtype": 5},
    ),
    # ------------------------------------------------------------------ attention
    Entry(
        "causal_mask",
        "attention",
        model_part=True,
        substitutable=True,
        knob_family="_causal_mask",
        none_means=("device",),
        amended_keywords={"window": 27},
    ),
    Entry("repeat_kv", "attention", model_part=True, substitutable=True, knob_family="_repeat_kv", fixed_rank=4),
    Entry(
        "scaled_dot_product_attention",
        "attention",
        calls=("softmax", "repeat_kv", "causal_mask"),
        model_part=True,
        substitutable=True,
        tolerance="attention",
        precision_sample=lambda i, S, device: ((*_per_head(i, S), _causal(i, S, device)), {}),
        reference_only=frozenset({"fused", "causal"}),
        knob_family="_sdpa",
        any_leading_dims=True,
        core_rank=3,
        nan_rows_unspecified=True,
        none_means=("mask",),
        amended_keywords={"softcap": 25},
        constant_fit="sdpa_scale",
    ),
    Entry(
        "flash_attention",
        "attention",
        calls=("repeat_kv", "causal_mask"),
        model_part=True,
        substitutable=True,
        tolerance="attention",
        precision_sample=lambda i, S, device: (tuple(_per_head(i, S)), {"causal": True, "block_size": 4}),
        knob_family="_flash",
        any_leading_dims=True,
        core_rank=3,
        nan_rows_unspecified=True,
        constant_fit="flash_scale",
    ),
    Entry(
        "multihead_self_attention",
        "attention",
        calls=(
            "linear",
            "rmsnorm",  # protocol v2 (qk_norm): the per-head norms of q and k
            "rope",
            "repeat_kv",
            "scaled_dot_product_attention",
            "flash_attention",
            "softmax",
            "causal_mask",
        ),
        model_part=True,
        substitutable=True,
        tolerance="attention",
        precision_sample=lambda i, S, device: ((_x(i, S), *_mha_weights(i, S), S.H, S.H), {"theta": 10000.0}),
        reference_only=frozenset(
            {"bq", "bk", "bv", "bo", "cache", "layer", "rope_style", "rope_table_size", "rope_scaling", "attention"}
            | {"mask"}  # amendment 23: the key mask the model's attention_mask becomes
        ),
        style_keyword="rope_style",
        knob_family="_mha_family",
        batch_rows=True,
        nan_rows_unspecified=True,
        none_means=("n_kv_heads", "positions"),
        amended_keywords={"q_norm": 24, "k_norm": 24, "norm_eps": 24, "softcap": 25, "window": 27},
        constant_fit="mha_scale",
    ),
    # ------------------------------------------------------------------ losses
    Entry(
        "cross_entropy",
        "losses",
        calls=("softmax",),
        substitutable=True,
        tolerance="loss",
        precision_sample=lambda i, S, device: (
            (i.randn(S.B * S.T, S.V, seed=109, scale=3.0), i.token_ids(S.B * S.T, seed=110)),
            {},
        ),
        reference_only=_FUSED,
        knob_family="_cross_entropy",
        any_leading_dims=True,  # amendment 3: logits [..., V] with targets [...]
        shift_invariant=True,
    ),
    Entry(
        "lm_loss",
        "losses",
        calls=("cross_entropy", "softmax"),
        substitutable=True,
        tolerance="loss",
        precision_sample=lambda i, S, device: (
            (i.randn(S.B, S.T, S.V, seed=111, scale=3.0), i.token_ids(S.B, S.T, seed=112)),
            {},
        ),
        knob_family="_lm_loss",
        shift_invariant=True,
    ),
    Entry(
        "moe_load_balancing_loss",  # protocol v2 (moe, amendment 28): Mixtral's auxiliary loss for one layer
        "losses",
        calls=("softmax",),
        substitutable=True,
        tolerance="loss",
        capability="moe",
    ),
    # ------------------------------------------------------------------ sampling
    Entry(
        "sampling_probs",
        "sampling",
        calls=("softmax",),
        substitutable=True,
        tolerance="pointwise",
        precision_sample=lambda i, S, device: (
            (i.randn(4, S.V, seed=113, scale=2.0),),
            {"temperature": 0.8, "top_k": 9},
        ),
        catalog_groups=("sampling",),
        knob_family="_sampling_probs",
        any_leading_dims=True,  # logits [..., V]
        none_means=("top_k", "top_p"),
        shift_invariant=True,
    ),
    Entry(
        "sample",
        "sampling",
        calls=("sampling_probs", "softmax"),
        substitutable=True,
        catalog_groups=("sampling",),
        any_leading_dims=True,  # logits [..., V] -> ids [...]
        none_means=("top_k", "top_p", "generator"),
    ),
    # ------------------------------------------------------------------ model
    # building a model and bookkeeping over its parameters compute nothing with the components (a
    # table made at build time matters only through forward, whose closure holds them); so a
    # component's failure never excuses these, and a rerun with it replaced is never tried
    Entry(
        "build_model",
        "model",
        calls=(),
        reference_only=frozenset({"rope_style"}),
        style_keyword="rope_style",
        catalog_groups=("model", "init"),
    ),
    Entry("canonical_state_dict", "model", calls=(), catalog_groups=("model",)),
    Entry(
        "forward",
        "model",
        calls=(),
        calls_model_parts=True,
        tolerance="model",
        reference_only=frozenset({"positions"}),  # amendment 23
        catalog_groups=("model",),
        amended_keywords={"attention_mask": 23},
        none_means=("cache",),  # no cache: the whole sequence at once
    ),
    Entry(
        "new_cache",
        "kv_cache",
        calls=("forward",),
        calls_model_parts=True,
        tolerance="model",
        catalog_groups=("kv_cache",),
    ),
    Entry("cache_kv", "kv_cache", calls=("forward",), calls_model_parts=True, catalog_groups=("kv_cache",)),
    Entry(
        "generate",
        "generation",
        calls=("forward", "new_cache", "sample", "sampling_probs"),
        calls_model_parts=True,
        catalog_groups=("generation",),
        amended_keywords={"attention_mask": 23},
        none_means=("top_k", "top_p", "generator"),  # as sample's: generate samples through sampling_probs
        speed_only=("use_cache",),
    ),
    Entry("count_parameters", "model", calls=(), catalog_groups=("model",)),
    Entry("kv_cache_bytes", "model", substitutable=True, catalog_groups=("model",)),
    # ------------------------------------------------------------------ training
    Entry("get_batch", "training", substitutable=True, catalog_groups=("training",), none_means=("generator",)),
    Entry(
        "train_step",
        "training",
        calls=("forward", "cross_entropy", "lm_loss"),
        calls_model_parts=True,
        catalog_groups=("train_step", "training"),
        none_means=("max_grad_norm",),
    ),
    Entry(
        "train",
        "training",
        calls=("get_batch", "train_step", "forward", "cross_entropy", "lm_loss"),
        calls_model_parts=True,
        catalog_groups=("training",),
    ),
    Entry(
        "evaluate",
        "training",
        calls=("forward", "cross_entropy", "lm_loss"),
        calls_model_parts=True,
        catalog_groups=("evaluate",),
        windowed=True,
    ),
)

ENTRY: dict[str, Entry] = {e.name: e for e in ENTRIES}

# ---------------------------------------------------------------------------------------------
# views: the tables the suite reads, each computed from the entries

# the components a model is built from, in protocol order
MODEL_PARTS = tuple(e.name for e in ENTRIES if e.model_part)
# Which component (test module, rubric entry) each protocol name belongs to.
COMPONENT_OF = {e.name: e.component for e in ENTRIES}
# name -> the protocol names an implementation of it may call (directly or not): where a failing
# test may trace back to.
MAY_CALL = {e.name: e.may_call for e in ENTRIES if e.calls is not None}
# Names a correct version can stand in for inside an implementation: functions of tensors and
# numbers. Model-bound names (built models, caches, optimizers) cannot be swapped one at a time.
SUBSTITUTABLE = frozenset(e.name for e in ENTRIES if e.substitutable)
# the reference's keyword-only options the protocol does not have, per name that has some
REFERENCE_ONLY = {e.name: e.reference_only for e in ENTRIES if e.reference_only}
# the reference's option selecting the RoPE pairing, per name that has one
STYLE_KEYWORD = {e.name: e.style_keyword for e in ENTRIES if e.style_keyword}
# the catalog tags of the checks judging each name, besides the name itself
CATALOG_GROUPS = {e.name: e.catalog_groups for e in ENTRIES if e.catalog_groups}
# name -> its knob family's function name in harness/diagnosis/knobs.py
KNOB_FAMILIES = {e.name: e.knob_family for e in ENTRIES if e.knob_family}
# the math tolerance kind each name's own tests use, per name that test_precision judges
TOLERANCE_KIND = {e.name: e.tolerance for e in ENTRIES if e.tolerance}
# the names test_float64_computed_in_float64 judges, in protocol order
PRECISION_FUNCTIONS = tuple(e.name for e in ENTRIES if e.precision_sample is not None)
ANY_LEADING = frozenset(e.name for e in ENTRIES if e.any_leading_dims)
BATCH_ROWS = frozenset(e.name for e in ENTRIES if e.batch_rows)
FIXED_RANK = {e.name: e.fixed_rank for e in ENTRIES if e.fixed_rank is not None}
NONE_MEANS = {e.name: e.none_means for e in ENTRIES if e.none_means}
SPEED_ONLY = {e.name: e.speed_only for e in ENTRIES if e.speed_only}
WINDOWED = frozenset(e.name for e in ENTRIES if e.windowed)
ACTIVATION_FIT = {e.name: e.activation_fit for e in ENTRIES if e.activation_fit}
CONSTANT_FIT = {e.name: e.constant_fit for e in ENTRIES if e.constant_fit}
NAN_UNSPECIFIED = frozenset(e.name for e in ENTRIES if e.nan_rows_unspecified)
SHIFT_INVARIANT = frozenset(e.name for e in ENTRIES if e.shift_invariant)
# protocol v2: the names a capability brings, each with its capability (an implementation without it need not
# define them)
CAPABILITY_OF = {e.name: e.capability for e in ENTRIES if e.capability}
