"""Mixtral's sparse mixture-of-experts MLP (protocol v2, capability ``moe``, amendment 28): config keys ``n_experts``
and ``n_experts_per_token``, canonical names ``layers.{i}.mlp.router.weight [E, d]`` and
``layers.{i}.mlp.experts.{e}.{w_gate,w_up,w_down}.weight``; ``moe_mlp`` (a softmax router over the experts, the top
k kept and renormalised, SwiGLU experts) and ``moe_load_balancing_loss`` (Hugging Face's ``load_balancing_loss_func``
for one layer).

The router weights here are scaled so that the routing probabilities are neither uniform nor one-hot (a missing
renormalisation, a softmax over the wrong axis or one expert too many all show), and the inputs have no ties.
"""

import pytest
import torch
from einops import repeat

from . import models
from .harness.plugin.markers import judges
from .inputs import S
from .test_kv_cache import check_chunks

pytestmark = pytest.mark.component("model")

E = 5  # experts in the function-level tests: distinct from B, T, d_model and d_ff
TOP_K = 2


def moe_config(impl, **changes) -> dict:
    """The richest llama config the implementation supports, with 4 experts, 2 per token (``moe``)."""
    impl.require_capability("moe")
    return models.family_config(impl, "llama", **{"n_experts": 4, "n_experts_per_token": 2, **changes})


def moe_inputs(spec, *, seed: int, dtype=torch.float64, router_scale: float = 2.0, n_experts: int = E):
    """x ``[B, T, d]``, router ``[E, d]``, w_gate and w_up ``[E, f, d]``, w_down ``[E, d, f]``: fan-in weights, the
    router's times ``router_scale`` (logits of a few units: routing probabilities well away from ties)."""
    spec.impl.require_capability("moe")
    i = spec.inputs
    x = i.randn(S.B, S.T, S.d_model, seed=seed, dtype=dtype)
    router = i.fan_in_weight(n_experts, S.d_model, seed=seed + 1, dtype=dtype) * router_scale
    w_gate = torch.stack(
        [i.fan_in_weight(S.D_FF, S.d_model, seed=seed + 10 + e, dtype=dtype) for e in range(n_experts)]
    )
    w_up = torch.stack([i.fan_in_weight(S.D_FF, S.d_model, seed=seed + 20 + e, dtype=dtype) for e in range(n_experts)])
    w_down = torch.stack(
        [i.fan_in_weight(S.d_model, S.D_FF, seed=seed + 30 + e, dtype=dtype) for e in range(n_experts)]
    )
    return x, router, w_gate, w_up, w_down


@judges("moe_mlp")
@pytest.mark.bug_class("moe")
def test_moe_mlp(spec, dtype):
    """moe_mlp = sum over each token's top-2 of 5 experts of its renormalised router probability times that expert's
    SwiGLU, the router's softmax over the experts; tokens go to different experts (protocol: amendment 28)."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=281, dtype=dtype)
    spec.call(
        "moe_mlp",
        x,
        router,
        w_gate,
        w_up,
        w_down,
        top_k=TOP_K,
        behaviour="moe_mlp(x [3, 13, 80], router [5, 80], experts [5, 56, 80], top_k=2)",
        kind="matmul",
    )


@judges("moe_mlp")
@pytest.mark.bug_class("moe", "leading_dims")
@pytest.mark.parametrize("lead", ["2-D", "1-D", "4-D"])
def test_moe_mlp_any_leading_dims(spec, lead):
    """moe_mlp routes every token alike whatever leads it: x [N, d] (tokens flattened), a single token [d], and
    [2, B, T, d] (protocol: amendment 28, x [..., d])."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=287)
    x = {"2-D": x.reshape(-1, x.shape[-1]), "1-D": x[0, 0], "4-D": x.reshape(1, *x.shape).expand(2, *x.shape)}[lead]
    spec.call(
        "moe_mlp",
        x.contiguous(),
        router,
        w_gate,
        w_up,
        w_down,
        top_k=TOP_K,
        behaviour=f"moe_mlp of a {x.ndim}-D input {list(x.shape)}: any leading dims are allowed",
        kind="matmul",
    )


@judges("moe_mlp")
@pytest.mark.bug_class("moe")
@pytest.mark.parametrize("top_k", [1, 3])
def test_moe_mlp_other_top_k(spec, top_k):
    """top_k is honoured: 1 expert per token (its weight renormalised to 1) and 3 of 5 (protocol: amendment 28)."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=283)
    spec.call(
        "moe_mlp",
        x,
        router,
        w_gate,
        w_up,
        w_down,
        top_k=top_k,
        behaviour=f"moe_mlp(..., top_k={top_k}) with 5 experts",
        kind="matmul",
    )


@judges("moe_mlp")
@pytest.mark.bug_class("moe")
def test_moe_mlp_with_every_expert_is_the_dense_mixture(spec):
    """With top_k = n_experts every expert is chosen and the renormalised weights are the softmax itself: the output
    is the dense mixture sum_e softmax(x @ router.T)_e * swiglu_e(x) (protocol: amendment 28)."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=285)
    spec.call(
        "moe_mlp",
        x,
        router,
        w_gate,
        w_up,
        w_down,
        top_k=E,
        behaviour="moe_mlp(..., top_k=5) with 5 experts: the softmax-weighted mixture of every expert",
        kind="matmul",
    )


@judges("moe_mlp", uses=("swiglu",))
@pytest.mark.bug_class("moe")
def test_moe_weights_are_renormalised(spec):
    """The chosen experts' weights are renormalised to sum 1: with every expert the same SwiGLU, moe_mlp is that
    SwiGLU whatever the routing, with a router near uniform (top-2 of 5 probabilities sum to about 0.4)
    (protocol: amendment 28)."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=287, router_scale=0.3)
    same = [repeat(w[0], "a b -> e a b", e=E) for w in (w_gate, w_up, w_down)]
    actual = spec.impl.moe_mlp(x, router, *same, top_k=TOP_K)
    expected = spec.impl.swiglu(x, w_gate[0], w_up[0], w_down[0])
    spec.close(
        actual,
        expected,
        subject="moe_mlp",
        kind="matmul",
        axes="b t d",
        behaviour="moe_mlp with 5 identical experts (top_k=2, near-uniform router) equals swiglu with their weights",
    )


@judges("moe_mlp")
@pytest.mark.bug_class("moe")
def test_moe_unchosen_expert_has_no_effect(spec):
    """An expert no token chooses does not change the output: x's channel 0 is a constant 1 on which the router
    gives the last expert -30, so no token ranks it in its top 2; its weights changed (x7, shifted) leave moe_mlp
    as it was (protocol: amendment 28)."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=289)
    x = x.clone()
    x[..., 0] = 1.0
    router = router.clone()
    router[:, 0] = 0.0
    router[E - 1, 0] = -30.0
    actual = spec.call(
        "moe_mlp",
        x,
        router,
        w_gate,
        w_up,
        w_down,
        top_k=TOP_K,
        behaviour="moe_mlp(top_k=2) where no token chooses the last of 5 experts",
        kind="matmul",
    )
    changed = [w.clone() for w in (w_gate, w_up, w_down)]
    for w in changed:
        w[E - 1] = w[E - 1] * 7.0 + 0.5
    spec.close(
        spec.impl.moe_mlp(x, router, *changed, top_k=TOP_K),
        actual,
        subject="moe_mlp",
        kind="matmul",
        axes="b t d",
        behaviour="changing the weights of an expert no token chooses leaves moe_mlp unchanged",
    )


def unchosen_state_dict(config: dict, *, seed: int, device) -> dict:
    """Weights for ``config`` (top-1 routing) whose last expert no token chooses in any layer: its router row is the
    mean of experts 0's and 1's, so its logit never exceeds both of theirs (ties aside)."""
    sd = models.random_state_dict(config, seed=seed, device=device)
    last = config["n_experts"] - 1
    for i in range(config["n_layers"]):
        router = sd[f"layers.{i}.mlp.router.weight"].clone()
        router[last] = (router[0] + router[1]) / 2
        sd[f"layers.{i}.mlp.router.weight"] = router
    return sd


@judges("build_model", uses=("forward", "canonical_state_dict"))
@pytest.mark.bug_class("moe")
def test_moe_unchosen_expert_gets_no_gradient(spec):
    """In a model with top-1 routing whose last expert no token chooses (its router row the mean of two others'), the
    cross-entropy's gradient on that expert's weights is zero, while a chosen expert's is not (protocol: amendment
    28)."""
    config = moe_config(spec.impl, n_experts_per_token=1)
    sd = unchosen_state_dict(config, seed=291, device=spec.device)
    ids = spec.inputs.token_ids(2, 9, vocab=config["vocab_size"], seed=292)
    facts = spec.impl.cross_entropy_grads(models.build(spec.impl, config, sd), ids[:, :-1], ids[:, 1:])
    last = config["n_experts"] - 1
    unchosen = [f"layers.{i}.mlp.experts.{last}.{w}.weight" for i in range(2) for w in ("w_gate", "w_up", "w_down")]
    grads = {k: facts["grads"].get(k) for k in unchosen}
    moved = [k for k, g in grads.items() if g is not None and bool(g.abs().max() > 0)]
    failing = spec.failing(("moe_mlp",)) if moved else []
    if failing:  # which expert is unchosen is the routing's to decide: a wrong router chooses others
        raise spec.defer(
            failing,
            "the gradient on the weights of an expert no token chooses is zero",
            f"consequence of failing {', '.join(failing)}: {moved[0]} gets a gradient, and this model's last expert is "
            "unchosen only under the specified routing, which your moe_mlp does not compute (its own tests). Fix "
            "moe_mlp first.",
        )
    spec.close(
        {k: torch.zeros_like(sd[k]) if g is None else g for k, g in grads.items()},
        {k: torch.zeros_like(sd[k]) for k in unchosen},
        subject="forward",
        kind="model",
        behaviour="the gradient on the weights of an expert no token chooses is zero",
    )
    chosen = facts["grads"].get("layers.0.mlp.experts.0.w_down.weight")
    spec.require(
        chosen is not None and bool(chosen.abs().max() > 0),
        subject="forward",
        behaviour="a chosen expert's weights get a gradient",
        found="layers.0.mlp.experts.0.w_down.weight has none (or a zero one)",
    )


@judges("moe_load_balancing_loss")
@pytest.mark.bug_class("moe")
def test_moe_load_balancing_loss(spec, dtype):
    """The load-balancing loss of 40 tokens' router logits over 5 experts, top 2: E * sum_e f_e * P_e with f_e the
    fraction of tokens choosing e and P_e its mean softmax probability, as Hugging Face's load_balancing_loss_func
    (protocol: amendment 28)."""
    spec.impl.require_capability("moe")
    logits = spec.inputs.randn(40, E, seed=293, scale=2.0, dtype=dtype)
    spec.call(
        "moe_load_balancing_loss",
        logits,
        TOP_K,
        behaviour="moe_load_balancing_loss(router_logits [40, 5], top_k=2)",
        kind="loss",
    )


@judges("moe_load_balancing_loss")
@pytest.mark.bug_class("moe")
@pytest.mark.parametrize("top_k", [1, 3])
def test_moe_load_balancing_loss_of_a_uniform_router(spec, top_k):
    """A uniform router (all logits equal) gives P_e = 1/E and sum_e f_e = top_k, so the loss is exactly top_k,
    whichever experts the ties choose (protocol: amendment 28)."""
    spec.impl.require_capability("moe")
    logits = torch.zeros(12, E, dtype=torch.float64, device=spec.device)
    spec.close(
        spec.impl.moe_load_balancing_loss(logits, top_k),
        torch.tensor(float(top_k), dtype=torch.float64, device=spec.device),
        subject="moe_load_balancing_loss",
        kind="loss",
        behaviour=f"moe_load_balancing_loss of 12 tokens' equal logits over 5 experts, top_k={top_k}, is {top_k}",
    )


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("moe")
def test_logits_match_reference_with_moe(spec):
    """A llama config with 4 experts, 2 per token, routes each layer's MLP input through its experts: its logits
    equal the reference's (protocol: amendment 28)."""
    config = moe_config(spec.impl)
    sd = models.random_state_dict(config, seed=295, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=296)
    models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        behaviour="logits of a llama model with n_experts=4, n_experts_per_token=2 for ids [2, 11]",
    )


@judges("canonical_state_dict", uses=("build_model",))
@pytest.mark.bug_class("moe")
def test_moe_canonical_names(spec):
    """With experts the canonical weights name mlp.router.weight [E, d] and mlp.experts.{e}.{w_gate,w_up,w_down}.weight
    in place of the dense MLP's, and they come back as loaded (protocol: amendment 28)."""
    config = moe_config(spec.impl)
    sd = models.random_state_dict(config, seed=297, device=spec.device)
    got = spec.impl.canonical_state_dict(models.build(spec.impl, config, sd))
    spec.require(
        sorted(got) == sorted(sd),
        behaviour="canonical_state_dict with n_experts=4 names the router and each expert's SwiGLU, not mlp.w_gate",
        found=f"missing {sorted(set(sd) - set(got))}, unexpected {sorted(set(got) - set(sd))}",
    )
    moe = {k: v for k, v in sd.items() if ".mlp." in k}
    spec.close({k: got.get(k) for k in moe}, moe, behaviour="the router and expert weights come back as loaded")


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("moe")
def test_cache_equals_no_cache_with_moe(spec):
    """With experts, logits fed chunk by chunk through the cache equal one uncached forward: each token is routed on
    its own (protocol: amendment 28, forward with cache)."""
    check_chunks(spec, moe_config(spec.impl), [6, 1, 1, 9], seed=298)


@judges("moe_mlp")
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize("top_k", [0, E + 1])
def test_moe_mlp_rejects_a_bad_top_k(spec, top_k):
    """moe_mlp and moe_load_balancing_loss raise ValueError for a top_k outside [1, n_experts] (protocol: amendment
    28)."""
    x, router, w_gate, w_up, w_down = moe_inputs(spec, seed=299)
    spec.raises(
        ValueError,
        lambda: spec.impl.moe_mlp(x, router, w_gate, w_up, w_down, top_k=top_k),
        behaviour=f"moe_mlp(..., top_k={top_k}) with 5 experts raises ValueError",
        mention=(str(top_k),),
    )
    spec.raises(
        ValueError,
        lambda: spec.impl.moe_load_balancing_loss(x[0, :4] @ router.T, top_k),
        subject="moe_load_balancing_loss",
        behaviour=f"moe_load_balancing_loss(router_logits [4, 5], top_k={top_k}) raises ValueError",
        mention=(str(top_k),),
    )


@judges("build_model")
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize(
    "changes",
    [
        {"n_experts_per_token": 0},
        {"n_experts_per_token": 5},
        {"n_experts_per_token": None},
        {"n_experts": -1},
        {"n_experts": 0, "n_experts_per_token": 2},
    ],
    ids=["k_0", "k_above_n_experts", "k_missing", "n_experts_negative", "k_without_experts"],
)
def test_moe_bad_config_raises(spec, changes):
    """n_experts_per_token outside [1, n_experts], missing with experts or given without them, and a negative
    n_experts raise ValueError naming the value (protocol: amendment 28)."""
    config = {k: v for k, v in dict(moe_config(spec.impl), **changes).items() if v is not None}
    key = next(iter(changes)) if len(changes) == 1 else "n_experts_per_token"
    spec.raises(
        ValueError,
        lambda: spec.impl.build(config, None, seed=0),
        behaviour=f"build_model with {changes} (n_experts {config['n_experts']}) raises ValueError",
        mention=(key,),
    )


@judges("build_model")
@pytest.mark.bug_class("validation")
def test_moe_needs_the_llama_family(spec):
    """n_experts on a gpt2 config raises ValueError naming n_experts (protocol: amendment 28)."""
    spec.impl.require_capability("moe")
    config = models.family_config(spec.impl, "gpt2", n_experts=4, n_experts_per_token=2)
    spec.raises(
        ValueError,
        lambda: spec.impl.build(config, None, seed=0),
        behaviour="build_model({family: 'gpt2', n_experts: 4, n_experts_per_token: 2}) raises ValueError",
        mention=("n_experts",),
    )
