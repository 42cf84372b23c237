"""Model configs, canonical weights and builders shared by the model-level tests.

Configs are judged in what the implementation supports (its ``CAPABILITIES``, see
``spec_tests/protocol.py``): a config varies what the implementation can vary and keeps the rest at
the protocol's defaults, so MHA-only, tied-only or fixed-``d_ff`` code still gets every behaviour
check that applies to it.
"""

from __future__ import annotations

from . import inputs
from .inputs import S

# The sizes a config may take under a spec seed (``inputs.set_seed``): the first of each is the
# default seed's, and any other seed draws from the rest, so that no config of a graded run is one
# of the handout's (whose counts and byte sizes a student has seen). Within a config every size
# differs from every other (d_head from n_heads, d_ff from d_model and the vocabulary), Llama's
# d_head is even (RoPE), and GQA keeps n_kv_heads = 2, n_rep = 4, so a transposed or mis-grouped
# axis never goes unseen whichever sizes are drawn.
VOCAB_SIZES = (S.V, 61, 71, 73, 79, 83)
LLAMA_D_MODELS = (S.d_model, 48, 96)  # n_heads 8: d_head 10, 6, 12
LLAMA_D_FFS = (S.D_FF, 40, 72)
GPT2_D_MODELS = (42, 30, 54)  # n_heads 6: d_head 7, 5, 9
GPT2_D_FFS = (50, 38, 58)

LLAMA_GQA: dict = {}
LLAMA_MHA: dict = {}
GPT2: dict = {}
CONFIGS = {"llama_gqa": LLAMA_GQA, "llama_mha": LLAMA_MHA, "gpt2": GPT2}


def config_sizes(seed: int) -> dict[str, int]:
    """The varying sizes of the test configs under spec seed ``seed`` (the defaults for the default seed)."""
    import random

    if seed == inputs.DEFAULT_SEED:
        pick = [choices[0] for choices in (VOCAB_SIZES, LLAMA_D_MODELS, LLAMA_D_FFS, GPT2_D_MODELS, GPT2_D_FFS)]
    else:
        rng = random.Random(f"spec-configs:{seed}")
        pick = [rng.choice(c[1:]) for c in (VOCAB_SIZES, LLAMA_D_MODELS, LLAMA_D_FFS, GPT2_D_MODELS, GPT2_D_FFS)]
    keys = ("vocab_size", "llama_d_model", "llama_d_ff", "gpt2_d_model", "gpt2_d_ff")
    return dict(zip(keys, pick))


def size_configs(seed: int) -> None:
    """Set the test configs (in place: every module holding them sees the change) for ``seed``."""
    z = config_sizes(seed)
    # All sizes distinct; GQA with n_kv_heads = 2, n_rep = 4; d_head = 10 with the default seed.
    gqa = dict(
        family="llama",
        vocab_size=z["vocab_size"],
        context_length=29,
        d_model=z["llama_d_model"],
        n_layers=2,
        n_heads=S.H,
        n_kv_heads=S.H_KV,
        d_ff=z["llama_d_ff"],
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=True,
    )
    gpt2 = dict(
        family="gpt2",
        vocab_size=z["vocab_size"],
        context_length=29,
        d_model=z["gpt2_d_model"],
        n_layers=2,
        n_heads=6,
        n_kv_heads=6,
        d_ff=z["gpt2_d_ff"],
        norm_eps=1e-5,
        tie_embeddings=True,
    )
    for target, value in (
        (LLAMA_GQA, gqa),
        (LLAMA_MHA, dict(gqa, n_kv_heads=S.H, tie_embeddings=False, rope_theta=500.0)),
        (GPT2, gpt2),
    ):
        target.clear()
        target.update(value)


size_configs(inputs.spec_seed())
EMBEDDING_STD = 0.1


def n_kv(cfg: dict) -> int:
    return cfg.get("n_kv_heads") or cfg["n_heads"]


def d_head(cfg: dict) -> int:
    return cfg["d_model"] // cfg["n_heads"]


def supported(impl, cfg: dict, *, need=()) -> dict:
    """``cfg`` as the implementation can run it, or a skip naming what it lacks.

    ``need``: features the test is about ("gqa", "tied_head", "untied_head", "dropout"); lacking
    one skips the test. Other features are moved to what the implementation supports: MHA for
    GQA, the supported tying, ``d_ff = 4 d_model`` without ``free_d_ff``, ``rope_theta`` 10000
    without ``rope_theta``.
    """
    impl.require_family(cfg.get("family", "llama"))
    caps = impl.capabilities
    cfg = dict(cfg)
    if cfg.get("family", "llama") == "llama":  # protocol v2 (amendment 26): what every model of it has
        cfg.update(impl.fixed_config)
    grouped = n_kv(cfg) < cfg["n_heads"]
    if grouped and "gqa" not in caps:
        if "gqa" in need:
            impl.require_capability("gqa")
        cfg["n_kv_heads"] = cfg["n_heads"]
    tie = "tied_head" if cfg.get("tie_embeddings", True) else "untied_head"
    if tie not in caps:
        if tie in need:
            impl.require_capability(tie)
        other = "untied_head" if tie == "tied_head" else "tied_head"
        impl.require_capability(other)
        cfg["tie_embeddings"] = other == "tied_head"
    if cfg.get("dropout", 0.0) > 0:
        impl.require_capability("dropout")
    if "free_d_ff" not in caps:
        cfg["d_ff"] = 4 * cfg["d_model"]
    if "rope_theta" not in caps and cfg.get("family", "llama") == "llama":
        cfg["rope_theta"] = 10000.0
    return cfg


def family_config(impl, family: str, *, need=(), **changes) -> dict:
    """The richest config of ``family`` the implementation supports (GQA and tying where it can)."""
    base = LLAMA_GQA if family == "llama" else GPT2
    return supported(impl, dict(base, **changes), need=need)


def without_window(cfg: dict) -> dict:
    """``cfg`` with no sliding window: every layer v1's causal attention, the same weights (amendment 27)."""
    return {k: v for k, v in cfg.items() if k not in ("sliding_window", "layer_types")}


def canonical_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Canonical weight names of protocol v1 and their shapes for ``cfg``."""
    d, v, f, dh = cfg["d_model"], cfg["vocab_size"], cfg["d_ff"], d_head(cfg)
    hq, hkv, gpt2 = cfg["n_heads"] * dh, n_kv(cfg) * dh, cfg.get("family", "llama") == "gpt2"
    shapes = {"tok_embeddings.weight": (v, d)}
    if gpt2:
        shapes["pos_embeddings.weight"] = (cfg["context_length"], d)
    for i in range(cfg["n_layers"]):
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
            n_experts = cfg.get("n_experts") or 0
            if n_experts:  # protocol v2 (amendment 28): a router and n_experts SwiGLU experts replace the dense MLP
                layer["mlp.router.weight"] = (n_experts, d)
                for e in range(n_experts):
                    expert = f"mlp.experts.{e}"
                    layer.update({f"{expert}.w_gate.weight": (f, d), f"{expert}.w_up.weight": (f, d)})
                    layer[f"{expert}.w_down.weight"] = (d, f)
            else:
                layer.update({"mlp.w_gate.weight": (f, d), "mlp.w_up.weight": (f, d), "mlp.w_down.weight": (d, f)})
            if cfg.get("qkv_bias"):  # protocol v2 (amendment 22): q, k, v only, not wo nor the MLP
                layer.update({"attn.wq.bias": (hq,), "attn.wk.bias": (hkv,), "attn.wv.bias": (hkv,)})
            if cfg.get("qk_norm"):  # protocol v2 (amendment 24): one [d_head] gain each, shared by the heads
                layer.update({"attn.q_norm.weight": (dh,), "attn.k_norm.weight": (dh,)})
            if cfg.get("post_norms"):  # protocol v2 (amendment 26): Gemma 2's norms on the sublayers' outputs
                layer.update({"attn_post_norm.weight": (d,), "mlp_post_norm.weight": (d,)})
        shapes.update({f"layers.{i}.{k}": s for k, s in layer.items()})
    shapes["final_norm.weight"] = (d,)
    if gpt2:
        shapes["final_norm.bias"] = (d,)
    if not cfg.get("tie_embeddings", True):
        shapes["lm_head.weight"] = (v, d)
    return shapes


def offset_norm_names(cfg: dict) -> set[str]:
    """The canonical norm weights that ``norm_offset`` stores as offsets (amendment 26): the model's RMSNorms of
    v1 (``attn_norm``, ``mlp_norm``, ``final_norm``) and ``post_norms``' two per layer."""
    per_layer = ("attn_norm.weight", "mlp_norm.weight", "attn_post_norm.weight", "mlp_post_norm.weight")
    names = {f"layers.{i}.{n}" for i in range(cfg["n_layers"]) for n in per_layer}
    return names | {"final_norm.weight"}


def random_state_dict(cfg: dict, *, seed: int, dtype="float64", device="cpu"):
    """Canonical weights at a scale that keeps activations O(1) and every component visible.

    Matrices ~ N(0, 1/fan_in), norm gains in [0.5, 1.5] (with ``norm_offset`` the weights are the offsets
    gain - 1, in [-0.5, 0.5]: ``1 + weight`` gives the same gains), biases ~ N(0, 0.3²), embeddings
    ~ N(0, 0.1²): small embeddings leave the residual stream to attention and the MLP, so logits
    (and greedy tokens) depend on the whole context. With N(0, 1) embeddings (tied) a model mostly
    echoes its last token, and cropping or sliding mistakes in generation go unseen.
    """
    import torch

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    offset_norms = offset_norm_names(cfg)
    sd = {}
    for i, (name, shape) in enumerate(canonical_shapes(cfg).items()):
        s = seed * 1000 + i
        if name.endswith("norm.weight"):
            sd[name] = inputs.norm_weight(*shape, seed=s, dtype=dtype, device=device)
            if cfg.get("norm_offset") and name in offset_norms:  # amendment 26: the gain is 1 + weight
                sd[name] = sd[name] - 1
        elif name.endswith(".bias"):
            sd[name] = inputs.randn(*shape, seed=s, scale=0.3, dtype=dtype, device=device)
        elif "embeddings" in name:
            sd[name] = inputs.randn(*shape, seed=s, scale=EMBEDDING_STD, dtype=dtype, device=device)
        else:
            sd[name] = inputs.fan_in_weight(*shape, seed=s, dtype=dtype, device=device)
    return sd


# The global seed a model built from a state dict is built under: whatever an implementation initialises and
# does not load (a head copied from the embedding before loading, say) is then the same in every build, so a
# relation between two builds of the same weights judges what it is meant to. Whether the weights alone determine
# the model is build_model's own test (test_model.py::test_model_is_determined_by_its_weights).
BUILD_SEED = 0


def build(m, cfg: dict, state_dict: dict | None = None, **kw):
    """``m.build_model(cfg, copies of state_dict)`` in the weights' dtype and device, in eval mode (``m``: a
    subject), under the global seed ``BUILD_SEED`` unless ``seed`` is given."""
    if state_dict is not None:
        first = next(iter(state_dict.values()))
        kw.setdefault("dtype", str(first.dtype).removeprefix("torch."))
        kw.setdefault("device", first.device.type)
        kw.setdefault("seed", BUILD_SEED)
        # copies: a model that keeps the tensors it is given (test_build_model_copies_the_given_weights) must not
        # carry its training into the test's own weights, from which the reference and later builds start
        state_dict = {k: v.clone() for k, v in state_dict.items()}
    return m.build(cfg, state_dict, **kw)


def determined(m, cfg: dict, state_dict: dict, ids, tol) -> bool:
    """Whether the model built from ``state_dict`` computes the same logits for ``ids`` built under two other
    global seeds: whether its weights alone determine it. True where one model's logits already vary from call to
    call (the forward pass itself then says nothing about the weights)."""
    from .harness.judging.compare import mismatch

    model = build(m, cfg, state_dict, seed=BUILD_SEED + 1)
    first = m.forward(model, ids)
    if mismatch(m.forward(model, ids), first, tol) is not None:
        return True
    return mismatch(m.forward(build(m, cfg, state_dict, seed=BUILD_SEED + 2), ids), first, tol) is None


PLAIN_SEED = 277


def plain_given(spec, family: str = "llama", **changes):
    """``spec.check``'s ``given`` for a model check of an option (protocol v2's, a window, a scaling): the check
    presumes the model is right without it. Where the implementation's logits on the family's plain configuration
    (``family_config``, fresh weights) differ from the reference's, the check cannot judge the option: one mistake
    in the model fails every model check, and test_logits_match_reference charges it to forward."""
    from .harness.judging.compare import mismatch
    from .harness.judging.tolerances import tolerance

    def holds() -> bool:
        impl = getattr(spec.impl, "_subject", spec.impl)  # without crash probing: a side computation
        plain = family_config(spec.impl, family, **changes)
        sd = random_state_dict(plain, seed=PLAIN_SEED, device=spec.device)
        ids = spec.inputs.token_ids(2, 9, vocab=plain["vocab_size"], seed=PLAIN_SEED)
        want = spec.expected(lambda m, sd, ids: logits(m, plain, sd, ids), sd, ids, label="plain model")
        return mismatch(logits(impl, plain, sd, ids), want, tolerance("model", device=spec.device)) is None

    why = f"your model's logits are wrong on the plain {family} configuration too (test_logits_match_reference)"
    return ("forward",), holds, why


def check_option_logits(spec, config: dict, sd: dict, ids, *, behaviour: str, variants=(), label=None):
    """``spec.check`` of the logits of a model whose config has an option (protocol v2's, a scaling, a window):
    judged as ``forward`` at the model tolerance, where the plain model is right (``plain_given``). Where the
    implementation supports the head tied and untied, the same check then runs with the head tied the other way (the
    other weights the same): an option whose code path goes through the head (a final soft-cap) may be applied on
    one kind of head only (held out: the cap only in the tied head's ``attend``)."""

    def judged(cfg, weights, given, *, label, behaviour, variants=(), readings=()):
        return spec.check(
            lambda m, sd, ids: logits(m, cfg, sd, ids),
            weights,
            ids,
            given=given,
            subject="forward",
            kind="model",
            axes="b t v",
            label=label,
            variants=variants,
            weights_used=True,
            behaviour=behaviour,
            readings=[*readings, lambda tol: undetermined_reading(spec, cfg, weights, ids, tol)],
        )

    out = judged(config, sd, plain_given(spec), label=label, behaviour=behaviour, variants=variants)
    other = other_tying(spec.impl, config, sd)
    if other is not None:
        config2, sd2 = other
        head = "untied" if config.get("tie_embeddings", True) else "tied"
        judged(
            config2,
            sd2,
            plain_given(spec, config.get("family", "llama"), tie_embeddings=config2["tie_embeddings"]),
            label=f"{label or 'logits'}, {head} head",
            behaviour=f"{behaviour}, with the head {head} (the other weights the same)",
            readings=[lambda tol: tying_reading(head)],
        )
    return out


HEAD_SEED = 4099  # an untied head's own weight, drawn where a tied model's check runs again untied


def other_tying(impl, config: dict, sd: dict):
    """``(config, state_dict)`` with the head tied the other way, or None where the implementation does not support
    both. Untying adds an ``lm_head.weight`` of its own (drawn as ``random_state_dict`` draws it); tying drops it."""
    tied = config.get("tie_embeddings", True)
    if not {"tied_head", "untied_head"} <= set(impl.capabilities):
        return None
    config2 = dict(config, tie_embeddings=not tied)
    if tied:
        head = random_state_dict(config2, seed=HEAD_SEED, device=next(iter(sd.values())).device)["lm_head.weight"]
        return config2, dict(sd, **{"lm_head.weight": head.to(sd["tok_embeddings.weight"].dtype)})
    return config2, {k: v for k, v in sd.items() if k != "lm_head.weight"}


def tying_reading(head: str) -> tuple[list[str], list[str]]:
    """The cause where an option's logits are right with one kind of head and wrong with the other (this check runs
    only after the same check passed with the head tied the other way, and on a plain model right both ways)."""
    return [
        f"likely cause: with this option the logits are right with the head tied the other way and wrong with the "
        f"head {head} (the other weights the same, and the plain model is right both ways): the option's path misses "
        f"the {head} head (applied only where the head is "
        f"{'the embedding' if head == 'untied' else 'a weight of its own'}). Fix: apply the option whichever weight "
        f"the head uses"
    ], ["tying"]


def undetermined_reading(spec, config: dict, sd: dict, ids, tol) -> tuple[list[str], list[str]]:
    """Where the implementation's model of ``config`` built from ``sd`` gives other logits under another global seed,
    a line saying so: a parameter the config creates is left at its random initialisation (test_model.py's
    determinism test judges only the plain configurations)."""
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    try:
        if determined(impl, config, sd, ids, tol):
            return [], []
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return [], []
    return [
        "likely cause: the model built twice from these same weights, under two global seeds, gives different "
        "logits: a parameter this configuration creates is left at its random initialisation instead of loaded (a "
        "weight or bias that no canonical name fills, such as a bias the option adds where the protocol has none). "
        "Fix: create only the parameters the configuration's canonical names hold, and load every one of them"
    ], ["undetermined"]


def logits(m, cfg: dict, state_dict: dict, ids):
    """Logits of a freshly built model: ``[B, T, V]``."""
    return m.forward(build(m, cfg, state_dict), ids)
