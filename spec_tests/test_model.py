"""The whole model: canonical weights, logits for both families (MHA and GQA), causality, batch
independence, weight tying, initialisation, parameter counts and configuration errors."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import models, observed
from .harness.diagnosis.bookkeeping import count_variants
from .harness.diagnosis.variant import Variant
from .harness.judging.compare import mismatch
from .harness.judging.tolerances import BIT_IDENTICAL, EXACT, Tolerance, tolerance
from .harness.plugin.markers import judges
from .harness.subject.subject import ImplementationError
from .models import CONFIGS
from .protocol import config_defaults
from .strategies import seeds

pytestmark = pytest.mark.component("model")


@pytest.fixture(params=list(CONFIGS))
def config(request, impl):
    """Each test config (llama GQA, llama MHA untied, gpt2), as the implementation can run it."""
    return models.supported(impl, CONFIGS[request.param], need=("gqa",) if request.param == "llama_gqa" else ())


def ids_for(spec, cfg, b=3, t=11, seed=0):
    return spec.inputs.token_ids(b, t, vocab=cfg["vocab_size"], seed=seed)


@judges("canonical_state_dict", uses=("build_model",))
def test_canonical_state_dict_roundtrip(spec, config):
    """build_model(config, sd) loads canonical weights and canonical_state_dict returns them unchanged (protocol:
    canonical weight names; amendment 1: copied exactly)."""
    check_roundtrip(spec, config)


@judges("canonical_state_dict", uses=("build_model",))
def test_canonical_state_dict_roundtrip_with_a_gqa_gpt2(spec):
    """A gpt2 model with fewer kv heads than query heads gives its loaded weights back unchanged: code that fuses
    wq, wk, wv into one c_attn and splits it back in three equal parts on the way out (as if k and v had n_heads
    heads) is judged here, the shared configs giving GQA to llama only (protocol: canonical weight names;
    Conventions, GQA)."""
    check_roundtrip(spec, models.family_config(spec.impl, "gpt2", need=("gqa",), n_kv_heads=2))


def check_roundtrip(spec, config: dict) -> None:
    sd = models.random_state_dict(config, seed=1, device=spec.device)
    model = models.build(spec.impl, config, sd)
    got = spec.impl.canonical_state_dict(model)
    spec.require(
        sorted(got) == sorted(sd),
        behaviour="canonical_state_dict uses exactly the canonical names",
        found=f"missing {sorted(set(sd) - set(got))}, unexpected {sorted(set(got) - set(sd))}",
    )
    behaviour = "weights come back exactly as they were loaded"
    wrong = [k for k in sd if mismatch(got[k], sd[k], EXACT) is not None]
    failing = spec.failing(("build_model",)) if wrong else []
    if failing:  # weights that share one parameter in the model come back as the last loaded: build_model's mistake
        shared = {n for group in spec.impl.shared_canonical_names(model) for n in group}
        if set(wrong) <= shared:
            raise spec.defer(
                failing,
                behaviour,
                f"consequence of failing build_model: {len(wrong)} weights come back otherwise than loaded, and each "
                "shares one parameter of your model with other canonical weights "
                "(test_each_canonical_weight_has_a_parameter_of_its_own), so loading one writes over the others. "
                "Fix build_model first.",
            )
    if wrong and set(wrong) <= exported_apart(spec, config, sd):  # what the loading leaves to the initialisation
        why = (
            f"fails its own tests, and {', '.join(wrong)} come back otherwise than loaded and differently from two "
            "models built from the same weights under other global seeds: the loading leaves them to the random "
            "initialisation (test_model_is_determined_by_its_weights), and the export gives back what the model holds"
        )
        with spec.unless_failing(("build_model",), behaviour, why):
            spec.close({k: got[k] for k in sd}, sd, tol=EXACT, behaviour=behaviour)
        return
    spec.close({k: got[k] for k in sd}, sd, tol=EXACT, behaviour=behaviour)


def exported_apart(spec, config, sd) -> set[str]:
    """The canonical names whose exported values differ between two models built from ``sd`` under global seeds 1
    and 2 (a side reading): what the loading leaves to the random initialisation."""
    raw = getattr(spec.impl, "_subject", spec.impl)
    try:
        exports = [raw.canonical_state_dict(models.build(raw, config, sd, seed=seed)) for seed in (1, 2)]
    except Exception:  # noqa: BLE001 - what does not run shows nothing
        return set()
    a, b = exports
    return {k for k in sd if k in a and k in b and not torch.equal(a[k].cpu(), b[k].cpu())}


FRESH = {  # (config, features it needs): every family tied and untied, and llama's GQA (gpt2's GQA is judged by
    # test_logits_match_reference_with_a_gqa_gpt2)
    "llama_gqa_tied": (lambda: models.LLAMA_GQA, ("gqa", "tied_head")),
    "llama_untied": (lambda: models.LLAMA_MHA, ("untied_head",)),
    "gpt2_tied": (lambda: models.GPT2, ("tied_head",)),
    "gpt2_untied": (lambda: dict(models.GPT2, tie_embeddings=False), ("untied_head",)),
}


@judges("build_model")
@pytest.mark.bug_class("weight_copies")
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_build_model_copies_the_given_weights(spec, family):
    """build_model copies the values it is given (protocol amendment 1: copy the given values exactly; Conventions:
    inputs are never modified in place): changing every parameter of the model built leaves the caller's state_dict
    as it was. A model that keeps the given tensors as its parameters (load_state_dict(assign=True), nn.Parameter(t))
    writes every later training step into the caller's tensors."""
    config = models.family_config(spec.impl, family)
    sd = models.random_state_dict(config, seed=18, device=spec.device)
    found = spec.impl.keeps_given_tensors(config, sd, device=spec.device)

    def listed(names):
        return ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")

    spec.require(
        not found["edited"],
        behaviour="build_model leaves the given state_dict as it was (inputs are never modified in place)",
        found=f"building the model changed {len(found['edited'])} of the given tensors: {listed(found['edited'])}",
    )
    spec.require(
        not found["kept"],
        behaviour="the model holds copies of the given weights: changing it leaves the given state_dict unchanged",
        found=f"changing the model's parameters changed {len(found['kept'])} of the given tensors: "
        f"{listed(found['kept'])}",
        causes=(
            "likely cause: build_model keeps the caller's tensors as the model's parameters "
            "(load_state_dict(..., assign=True), nn.Parameter(state_dict[name]) without a copy). Fix: copy them in "
            "(load_state_dict without assign, or param.copy_(value))",
        ),
        codes=("knob:in_place",),
    )


@judges("build_model", uses=("canonical_state_dict",))
@pytest.mark.bug_class("tied_weights")
@pytest.mark.parametrize("which", list(FRESH))
def test_each_canonical_weight_has_a_parameter_of_its_own(spec, which):
    """build_model(config, sd) holds each canonical weight in parameters of its own: no two canonical names share an
    element of the model's parameters (a tied head is one matrix under one name) (protocol: canonical weight names;
    count_parameters). One module put in several places ([module] * n,
    a clones() without deepcopy, one norm for both branches) shares its weight, and loading each name writes over the
    others. Every family, tied and untied, and llama's GQA."""
    base, need = FRESH[which]
    config = models.supported(spec.impl, base(), need=need)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=17, device=spec.device))
    shared = spec.impl.shared_canonical_names(model)
    said = "; ".join(", ".join(g[:4]) + (f" and {len(g) - 4} more" if len(g) > 4 else "") for g in shared[:3])
    spec.require(
        not shared,
        behaviour="every canonical weight is held in parameters of its own",
        found=f"{len(shared)} group(s) of canonical weights share one parameter of the model: {said}",
        causes=(
            "likely cause: one module is put in several places (the same instance in each layer or projection: "
            "[module] * n, nn.ModuleList([m] * n), a clones() without copy.deepcopy, one norm used for both branches), "
            "so its weight is shared. Fix: create a new module for each place",
        ),
        codes=("knob:layer_weights",),
    )


@judges("build_model", uses=("canonical_state_dict",))  # forward is called, not used: a forward that raises is
# charged to forward (a setup failure), and a wrong one gives both models the same logits
@pytest.mark.bug_class("init", "tied_weights")
@pytest.mark.parametrize("which", list(FRESH))
def test_a_fresh_model_runs_and_gives_canonical_weights(spec, which):
    """build_model(config) without a state_dict initialises a model (protocol: build_model, None -> initialise) that
    forward runs on [B, T] ids, giving [B, T, V] logits, whose canonical_state_dict holds exactly the canonical names
    and shapes, and which a model built from those weights reproduces (protocol: canonical_state_dict). The other
    tests build from given weights; a weight made in another shape at initialisation (a head allocated [in, out])
    shows only here. Every family, tied and untied, and llama's GQA."""
    base, need = FRESH[which]
    config = models.supported(spec.impl, base(), need=need)
    ids = ids_for(spec, config, seed=15)
    model = spec.impl.build(config, None, seed=0)
    try:
        logits = spec.impl.forward(model, ids)
    except ImplementationError as exc:  # build_model's where forward runs on the same config built from weights
        loaded = models.build(spec.impl, config, models.random_state_dict(config, seed=16, device=spec.device))
        spec.impl.forward(loaded, ids)  # raises too: forward's own crash, charged to it
        spec.require(
            False,
            behaviour="forward runs on a fresh model as on the same config built from canonical weights",
            found=f"forward raises on the fresh model ({exc.type_name}: {exc.message.splitlines()[0]}) and runs on "
            "the model built from weights",
            causes=(
                "likely cause: build_model's initialisation (no state_dict) makes a model forward cannot run: a weight "
                "made in another shape or dtype than loading gives it, or one left unset. Fix: initialise each weight "
                "in the shape and dtype the loaded model has",
            ),
            codes=("crash",),
        )
    want = (*ids.shape, config["vocab_size"])
    spec.require(
        tuple(logits.shape) == want,
        behaviour=f"forward on a fresh model gives logits [B, T, V] = {list(want)}",
        found=f"logits {list(logits.shape)}",
        codes=("shape",),
    )
    sd = spec.impl.canonical_state_dict(model)
    shapes = {k: tuple(v.shape) for k, v in models.random_state_dict(config, seed=16, device=spec.device).items()}
    spec.require(
        sorted(sd) == sorted(shapes),
        behaviour="a fresh model's canonical_state_dict uses exactly the canonical names",
        found=f"missing {sorted(set(shapes) - set(sd))}, unexpected {sorted(set(sd) - set(shapes))}",
    )
    wrong = {k: (tuple(sd[k].shape), s) for k, s in shapes.items() if tuple(sd[k].shape) != s}
    spec.require(
        not wrong,
        behaviour="a fresh model's canonical weights have the canonical shapes",
        found=", ".join(f"{k} {list(got)} (expected {list(s)})" for k, (got, s) in wrong.items()),
        codes=("shape",),
    )
    rebuilt = "a model built from a fresh model's canonical weights computes its logits"
    # the weights given back and loaded again: where canonical_state_dict or loading fails its own tests (a weight
    # permuted at load, or given back under another name), the difference is theirs
    with spec.unless_failing(("canonical_state_dict",), rebuilt, "fails its own round trip of loaded weights"):
        spec.close(
            spec.impl.forward(models.build(spec.impl, config, sd), ids),
            logits,
            kind="model",
            axes="b t v",
            behaviour=rebuilt,
        )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("layout", "attention_scale", "norm_placement", "rope", "gqa", "swiglu")
def test_logits_match_reference(spec, config, dtype):
    """Logits of a pre-norm decoder with the given canonical weights equal the reference's (course notes: decoder-only
    forward pass, add positions x = tok + pos; symptoms table: deep stack diverges, use pre-LN)."""
    sd = models.random_state_dict(config, seed=2, dtype=dtype, device=spec.device)
    ids = ids_for(spec, config, seed=3)
    check_logits(
        spec,
        config,
        sd,
        ids,
        behaviour=f"logits of the {config['family']} model (n_heads {config['n_heads']}, n_kv_heads "
        f"{models.n_kv(config)}, tied {config['tie_embeddings']}) for ids [3, 11]",
        variants=model_variants(config),
        model_knobs=True,
        readings=[lambda tol: kv_head_reading(spec, config, sd, ids, tol)],
    )


def kv_heads_read(m, config, sd, ids, tol) -> list[list[int]]:
    """For each query head of layer 0, the key/value heads it reads in the model: with every other query head's
    columns of wo zeroed, the kv heads whose key and value rows, scaled, change the logits."""
    dh, n_kv = models.d_head(config), models.n_kv(config)
    wo, wk, wv = (sd[f"layers.0.attn.{w}.weight"] for w in ("wo", "wk", "wv"))
    read = []
    for q in range(config["n_heads"]):
        alone = dict(sd)
        alone["layers.0.attn.wo.weight"] = torch.zeros_like(wo).index_copy(
            1, torch.arange(q * dh, (q + 1) * dh, device=wo.device), wo[:, q * dh : (q + 1) * dh]
        )
        base = models.logits(m, config, alone, ids)
        heads = []
        for j in range(n_kv):
            moved = dict(alone)
            for name, w in (("wk", wk), ("wv", wv)):
                w = w.clone()
                w[j * dh : (j + 1) * dh] *= 3.0
                moved[f"layers.0.attn.{name}.weight"] = w
            if mismatch(models.logits(m, config, moved, ids), base, tol) is not None:
                heads.append(j)
        read.append(heads)
    return read


def kv_head_reading(spec, config, sd, ids, tol) -> tuple[list[str], list[str]]:
    """Which key/value head each query head reads in the implementation's model, against the reference's, where
    they differ and each query head reads one (GQA's grouping in the model, however the code routes it)."""
    ref = getattr(spec.expectations, "reference", None)
    if ref is None or config.get("family") != "llama" or models.n_kv(config) == config["n_heads"]:
        return [], []
    try:
        own = kv_heads_read(unprobed(spec), config, sd, ids, tol)
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return [], []
    want = kv_heads_read(ref, config, sd, ids, tol)
    if own == want or any(len(heads) != 1 for heads in own):
        return [], []
    got = [heads[0] for heads in own]
    tiled = got == [q % models.n_kv(config) for q in range(config["n_heads"])]
    how = "tiled, h % n_kv_heads, " if tiled else ""
    return [
        f"likely cause: in the model's attention, query heads 0 to {len(got) - 1} read key/value heads {got} "
        f"({how}measured on the model: each query head alone, each kv head's weights moved) where "
        f"{[heads[0] for heads in want]} belongs (h // n_rep): the grouping of query heads onto key/value heads is "
        "wrong. Fix: query head h reads kv head h // (n_heads // n_kv_heads)"
    ], ["knob:gqa_mapping"]


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("rmsnorm", "layernorm")
def test_logits_follow_the_config_norm_eps(spec, family):
    """A config's norm_eps is the eps of every norm of the model: with norm_eps 1e-2 (the embeddings' mean square is
    about 0.01, so eps moves every first norm's output by tens of percents, and the final norm's alone by over ten
    tolerances: catalog final_norm_default_eps) the logits equal the reference's (protocol: Model). Its default is
    1e-5."""
    config = models.family_config(spec.impl, family, norm_eps=1e-2)
    sd = models.random_state_dict(config, seed=17, device=spec.device)
    check_logits(
        spec,
        config,
        sd,
        ids_for(spec, config, seed=18),
        behaviour=f"logits of a {family} model with norm_eps=1e-2 for ids [3, 11]",
        variants=model_variants(config),
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("dropout_generation")
def test_eval_mode_applies_no_dropout(spec, family):
    """A model with dropout 0.5 in eval mode computes the reference's logits, whatever the global random state:
    dropout applies in training mode only (protocol: amendment 10, the dropout capability; course notes: dropout
    accidentally enabled during generation)."""
    spec.impl.require_capability("dropout")
    config = models.family_config(spec.impl, family, dropout=observed.DROPOUT)
    sd = models.random_state_dict(config, seed=15, device=spec.device)
    model, ids = models.build(spec.impl, config, sd), ids_for(spec, config, seed=16)
    behaviour = f"a {family} model with dropout {observed.DROPOUT} in eval mode computes the same logits on every call"
    varies = observed.eval_mode_varies(spec, model, ids, spec.impl.forward(model, ids).detach())
    spec.require(
        not varies,
        behaviour=behaviour,
        found="two eval-mode forward passes under other global seeds give other logits: dropout is on in eval mode",
        causes=eval_dropout_causes(spec, model, ids) if varies else (),
        codes=("knob:mode",),
    )
    check_logits(
        spec,
        config,
        sd,
        ids_for(spec, config, seed=16),
        behaviour=f"logits of a {family} model with dropout {observed.DROPOUT} in eval mode (dropout off)",
    )


def eval_dropout_causes(spec, model, ids) -> tuple[str, ...]:
    """The cause of dropout on in eval mode: where some of the model's modules still report ``training`` after it
    was put in eval mode, the mode does not reach them; where every one reports eval and the model in training mode
    gives the same logits under every seed, the flag is read the wrong way round; else dropout ignores the flag."""
    raw = getattr(spec.impl, "_subject", spec.impl)
    try:
        flags = raw.training_flags(model)
    except Exception:  # noqa: BLE001 - unreadable: the flags say nothing
        flags = []
    try:  # the model in training mode, under two global seeds (the model is left in eval mode)
        raw.set_training(model, True)
        outs = []
        for seed in (5, 6):
            raw.manual_seed(seed)
            outs.append(raw.forward(model, ids).detach())
        inverted = torch.equal(outs[0], outs[1])
    except Exception:  # noqa: BLE001 - a reading that cannot run says nothing
        inverted = False
    finally:
        raw.set_training(model, False)
    if not any(flags) and inverted:
        return (
            "likely cause: the mode is read the wrong way round: in eval mode dropout is on (other logits under other "
            "seeds), in training mode it is off (the same logits under every seed), and every module reports the mode "
            "it was put in (a flag passed as inference= or deterministic= without negating it, or training=not "
            "self.training). Fix: apply dropout exactly when the module's training flag is True",
        )
    if any(flags):
        return (
            f"likely cause: after model.eval(), {sum(flags)} of the model's {len(flags)} modules still report "
            "training=True: the mode does not reach nested modules (a train()/eval() override that sets only the "
            "direct children, or a flag copied once at construction), so their dropout stays on. Fix: set the mode "
            "on every submodule (nn.Module.train(mode) recurses through self.children())",
        )
    return (
        "likely cause: dropout applies whatever the mode (F.dropout without training=self.training, or an "
        "attention dropout_p passed whatever the mode): every module reports eval mode. Fix: use nn.Dropout "
        "modules, or pass the module's training flag",
    )


def check_logits(spec, config, sd, ids, *, behaviour: str, **options) -> None:
    """``spec.check`` of a model's logits built from ``sd`` at the model tolerance, judged where its weights determine
    it (``undetermined``); ``options`` go to ``spec.check`` (variants, model knobs)."""
    spec.check(
        lambda m, sd, ids: models.logits(m, config, sd, ids),
        sd,
        ids,
        kind="model",
        axes="b t v",
        behaviour=behaviour,
        given=[
            undetermined(spec, config, sd, ids),
            held_weights(spec, config, sd, ids),
            shared_weights(spec, config, sd, ids),
        ],
        **options,
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("tied_weights")
def test_logits_match_reference_with_an_untied_gpt2_head(spec):
    """An untied gpt2 model's logits equal the reference's: its LM head is lm_head.weight as given, not the embedding
    (protocol: tie_embeddings, canonical weight names). The shared configs tie gpt2's head (as GPT-2 does), so code
    that supports both for gpt2 is judged untied here too (a loader that ties whatever the config says)."""
    config = models.family_config(spec.impl, "gpt2", need=("untied_head",), tie_embeddings=False)
    sd = models.random_state_dict(config, seed=9, device=spec.device)
    check_logits(
        spec,
        config,
        sd,
        ids_for(spec, config, seed=10),
        behaviour="logits of an untied gpt2 model (lm_head.weight given beside tok_embeddings.weight) for ids [3, 11]",
        variants=model_variants(config),
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("gqa")
def test_logits_match_reference_with_a_gqa_gpt2(spec):
    """A gpt2 model with fewer kv heads than query heads gives the reference's logits: the gqa capability is GQA "in
    models", whatever the family. The shared configs give GQA to llama only, so code whose gpt2 path assumes MHA (a
    fused c_attn split in three equal parts) is judged here (protocol: Model; Conventions, GQA)."""
    config = models.family_config(spec.impl, "gpt2", need=("gqa",), n_kv_heads=2)
    sd = models.random_state_dict(config, seed=12, device=spec.device)
    check_logits(
        spec,
        config,
        sd,
        ids_for(spec, config, seed=13),
        behaviour="logits of a gpt2 model with GQA (n_heads 6, n_kv_heads 2) for ids [3, 11]",
        variants=model_variants(config),
        model_knobs=True,
    )


def unprobed(spec):
    """The subject without crash probing (a crash of a check's side computation is not the test's to report)."""
    return getattr(spec.impl, "_subject", spec.impl)


def undetermined(spec, config, sd, ids):
    """``spec.check``'s ``given``: the logits of a model its weights do not determine (built again under another
    global seed, it computes others) cannot judge the forward pass; build_model's own tests say why."""
    return (
        ("build_model",),
        lambda: models.determined(unprobed(spec), config, sd, ids, tolerance("model", device=spec.device)),
        "the model these weights build computes other logits when it is built again under another global seed (part "
        "of it is initialised, not loaded)",
    )


def held_weights(spec, config, sd, ids, tol=None):
    """``spec.check``'s ``given``: where canonical_state_dict fails, a model that computes the specified logits of the
    weights it gives back (what it holds) is right; its weights were loaded wrong (a square weight left transposed,
    every weight rounded to float32 on the way in), which the roundtrip reports (test_canonical_state_dict_roundtrip).
    ``tol``: the check's own tolerance (default the model tolerance)."""

    def holds() -> bool:
        exact = tol is not None and tol.atol <= EXACT.atol  # a check to float64 rounding: a precision failure counts
        if not spec.failing(("canonical_state_dict",), **({"precision": True} if exact else {})):
            return True
        raw = unprobed(spec)
        model = models.build(raw, config, sd)
        # the values it holds, in the dtype it was given them (a float64 weight kept as float32 is float32 values)
        held = {
            k: v.detach().clone().to(sd[k].dtype if k in sd else v.dtype)
            for k, v in raw.canonical_state_dict(model).items()
        }
        want = spec.expected(lambda m, held, ids: models.logits(m, config, held, ids), held, ids, label="held")
        return mismatch(raw.forward(model, ids), want, tol or tolerance("model", device=spec.device)) is not None

    why = (
        "your model computes the specified logits of the weights it gives back (canonical_state_dict), which are not "
        "those it was given: they were loaded wrong"
    )
    return ("canonical_state_dict",), holds, why


def shared_weights(spec, config, sd, ids):
    """``spec.check``'s ``given``: where build_model fails and its model holds canonical weights in one shared
    parameter (``shared_canonical_names``), a model that computes the specified logits of the weights it gives back
    (each group one value: the last loaded) is right for what loading could hold; the sharing is build_model's
    (held out: a GluonNLP head built with the embedding's params whatever tie_embeddings says)."""

    def holds() -> bool:
        if not spec.failing(("build_model",)):
            return True
        raw = unprobed(spec)
        model = models.build(raw, config, sd)
        if not raw.shared_canonical_names(model):
            return True
        held = {
            k: v.detach().clone().to(sd[k].dtype if k in sd else v.dtype)
            for k, v in raw.canonical_state_dict(model).items()
        }
        want = spec.expected(lambda m, held, ids: models.logits(m, config, held, ids), held, ids, label="shared")
        return mismatch(raw.forward(model, ids), want, tolerance("model", device=spec.device)) is not None

    why = (
        "your model holds some canonical weights in one shared parameter (test_each_canonical_weight_has_a_parameter_"
        "of_its_own), so loading one writes over the others, and it computes the specified logits of the weights it "
        "holds"
    )
    return ("build_model",), holds, why


def _logits_with_eps(ref, config, sd, ids, *, final: bool):
    """The reference's logits with eps 1e-5 in the final norm alone (``final``) or in every norm but it."""
    model = models.build(ref, config, sd)
    for name, module in model.named_modules():
        if hasattr(module, "eps") and (name == "final_norm") == final:
            module.eps = 1e-5
    return ref.forward(model, ids)


def model_variants(config):
    """The reference model with one configuration knob changed (for diagnosis)."""
    found = []
    if config.get("norm_eps", 1e-5) != 1e-5:
        found.extend(
            (
                Variant(
                    "knob:eps_value",
                    "the model ignores config norm_eps (its norms use 1e-5)",
                    "pass norm_eps to every norm of the model",
                    lambda ref, sd, ids: models.logits(ref, dict(config, norm_eps=1e-5), sd, ids),
                ),
                Variant(
                    "knob:eps_value",
                    "the final norm ignores config norm_eps (it uses 1e-5; the blocks' norms take norm_eps)",
                    "pass norm_eps to the final norm as well",
                    lambda ref, sd, ids: _logits_with_eps(ref, config, sd, ids, final=True),
                ),
                Variant(
                    "knob:eps_value",
                    "the blocks' norms ignore config norm_eps (they use 1e-5; only the final norm takes it)",
                    "pass norm_eps to every block's norms",
                    lambda ref, sd, ids: _logits_with_eps(ref, config, sd, ids, final=False),
                ),
            )
        )
    if config["family"] != "llama":
        return found
    from .harness.subject.subject import reference_subject

    if config.get("rope_theta", 10000.0) != 10000.0:
        found.append(
            Variant(
                "knob:rope_theta",
                "the model ignores config rope_theta (it uses 10000)",
                "pass rope_theta to the RoPE tables",
                lambda ref, sd, ids: models.logits(ref, dict(config, rope_theta=10000.0), sd, ids),
            )
        )
    for style in ("interleaved", "half"):
        found.append(
            Variant(
                "knob:rope_style",
                f"the model's RoPE pairs channels {style}-style, not in its declared style (the same logits: the "
                "rows of wq and wk permuted at load, as Hugging Face's Llama conversion does, with the declared style)",
                "rotate the pairs of the declared ROPE_STYLE (rope and the model alike), and load wq and wk as they "
                "are given",
                lambda ref, sd, ids, style=style: (
                    None if ref.rope_style == style else models.logits(reference_subject(style), config, sd, ids)
                ),
            )
        )
    return found


REQUIRED_KEYS = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff")


def default_configs(impl, family) -> tuple[dict, dict]:
    """``(minimal, written)``: a test config of ``family`` by its required keys only (and what the implementation
    always has, amendment 26), and the same with the protocol's defaults written out."""
    base = models.supported(impl, models.LLAMA_MHA if family == "llama" else models.GPT2)
    minimal = {k: base[k] for k in REQUIRED_KEYS} | ({} if family == "llama" else {"family": "gpt2"})
    minimal |= {k: base[k] for k in impl.fixed_config if k in base}  # amendment 26: what it always has
    defaults = config_defaults(dict(minimal, family=family))  # the protocol's, spec_tests/protocol/names.py
    return minimal, dict(defaults, **minimal)


@judges("build_model", uses=("forward",))
def test_config_defaults(spec, family):
    """Omitted config keys take protocol defaults: n_kv_heads = n_heads, rope_theta 10000, norm_eps 1e-5, tied, no
    dropout, family llama (protocol: Model).

    A relation: the model configured only by the required keys computes what the implementation's own model with the
    defaults written out computes, from the same weights. A wrong default shows here whatever the forward pass
    computes; that model's logits are compared with the reference's in test_default_config_logits_match_reference.
    """
    spec.impl.require_capability("tied_head")
    minimal, written = default_configs(spec.impl, family)
    sd = models.random_state_dict(written, seed=11, device=spec.device)
    ids = ids_for(spec, written, seed=12)
    spec.close(
        models.logits(spec.impl, minimal, sd, ids),
        models.logits(spec.impl, written, sd, ids),
        kind="model",
        axes="b t v",
        behaviour=f"a {family} model configured only by {list(minimal)} computes what the same weights compute with "
        f"the defaults written out ({', '.join(f'{k}={written[k]}' for k in written if k not in minimal)})",
    )


@judges("kv_cache_bytes")
@pytest.mark.bug_class("memory")
def test_kv_cache_bytes_of_a_config_with_defaults_omitted(spec, family):
    """kv_cache_bytes of a config without its optional keys is that of the config with the protocol's defaults
    written out: n_kv_heads = n_heads (protocol: Model, kv_cache_bytes)."""
    minimal, written = default_configs(spec.impl, family)
    got = spec.impl.kv_cache_bytes(minimal, 3, 17)
    want = spec.expected(lambda m, c: m.kv_cache_bytes(c, 3, 17), written, label="written")
    spec.require(
        got == want,
        behaviour=f"kv_cache_bytes of a {family} config by its required keys only counts n_kv_heads = n_heads",
        found=f"{got} bytes, {want} expected",
    )


@judges("forward", uses=("build_model",))
def test_default_config_logits_match_reference(spec, family):
    """Logits of a model with every optional config key at its protocol default (written out) equal the reference's
    (protocol: Model)."""
    spec.impl.require_capability("tied_head")
    _, written = default_configs(spec.impl, family)
    sd = models.random_state_dict(written, seed=11, device=spec.device)
    check_logits(
        spec,
        written,
        sd,
        ids_for(spec, written, seed=12),
        behaviour=f"logits of a {family} model with the protocol's defaults written out",
    )


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("tied_weights")
def test_model_is_determined_by_its_weights(spec, config):
    """A model built from canonical weights computes the same logits whatever the global random state held when it
    was built: build_model loads every weight it is given, and no part of the model keeps its initialisation
    (protocol: build_model; symptoms table: weights copied, not shared)."""
    check_determined(spec, config)


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("tied_weights")
def test_an_untied_gpt2_model_is_determined_by_its_weights(spec):
    """test_model_is_determined_by_its_weights for an untied gpt2 model: the shared configs tie gpt2's head (as GPT-2
    does), so a loader that skips lm_head for gpt2 ("GPT-2 ties the weights") keeps an initialised head only here
    (protocol: build_model, tie_embeddings)."""
    check_determined(spec, models.family_config(spec.impl, "gpt2", need=("untied_head",), tie_embeddings=False))


def unloaded_reading(spec, sd, first, second) -> tuple[list[str], list[str]]:
    """The canonical weights that come back differently from two models built from the same ``sd`` (under other
    global seeds): the loading leaves them, or part of them, to the initialisation or to uninitialised memory.
    Nothing where canonical_state_dict raises or gives both models the same weights."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    try:
        a, b = raw.canonical_state_dict(first), raw.canonical_state_dict(second)
        differ = [
            k for k in sd if k in a and k in b and a[k].shape == b[k].shape and not torch.equal(a[k].cpu(), b[k].cpu())
        ]
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return [], []
    if not differ:
        return [], []
    shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
    return [
        f"likely cause: {shown} come{'s' * (len(differ) == 1)} back from canonical_state_dict differently from two "
        "models built from the same weights: the loading leaves them (or some of their rows) to the random "
        "initialisation or to uninitialised memory (torch.empty), e.g. a shard of a fused weight written at the wrong "
        "offset or a name the loader skips. Fix: copy every given weight into the parameter that uses it"
    ], ["knob:tying"]


def check_determined(spec, config) -> None:
    """The same logits from models built from ``config``'s canonical weights under global seeds 1 and 2."""
    sd = models.random_state_dict(config, seed=13, device=spec.device)
    ids = ids_for(spec, config, seed=14)
    model = models.build(spec.impl, config, sd, seed=1)
    first = spec.impl.forward(model, ids)
    if mismatch(spec.impl.forward(model, ids), first, tolerance("model", device=spec.device)) is not None:
        raise spec.defer(
            ["forward"],
            "a model built from the same weights under global seeds 1 and 2 computes the same logits",
            "not judged: one model's logits vary from call to call (forward), so they say nothing about its weights",
        )
    again = models.build(spec.impl, config, sd, seed=2)
    second = spec.impl.forward(again, ids)
    spec.close(
        second,
        first,
        kind="model",
        axes="b t v",
        behaviour="a model built from the same weights under global seeds 1 and 2 computes the same logits",
        hint="likely cause (weak evidence): part of the model keeps its random initialisation instead of the weights "
        "given (a tied head copied from the embedding before loading, a weight the loading misses). Fix: load every "
        "canonical weight, and tie by sharing the Parameter",
        hint_code="~knob:tying",
        readings=[lambda tol: unloaded_reading(spec, sd, model, again)],
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("causality")
@given(seed=seeds, cut=st.integers(1, 10))
def test_future_tokens_do_not_change_earlier_logits(spec, config, seed, cut):
    """Changing tokens from position t on leaves logits before t bit-identical (course notes: causal masking, symptom
    "model cheats")."""
    sd = models.random_state_dict(config, seed=4, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids = ids_for(spec, config, b=2, seed=seed)
    changed = ids.clone()
    changed[:, cut:] = (ids[:, cut:] + 1 + seed % 7) % config["vocab_size"]
    before, after = spec.impl.forward(model, ids), spec.impl.forward(model, changed)
    spec.close(
        after[:, :cut],
        before[:, :cut],
        tol=BIT_IDENTICAL,
        axes="b t v",
        behaviour=f"logits before position {cut} ignore tokens from {cut} on",
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("batch_mixing")
def test_batch_rows_are_independent(spec, config):
    """Each sequence's logits are the same computed alone or in a batch of different sequences (course notes: shapes
    [B, T, ...])."""
    sd = models.random_state_dict(config, seed=5, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids = ids_for(spec, config, b=3, seed=6)
    batched = spec.impl.forward(model, ids)
    alone = torch.cat([spec.impl.forward(model, ids[b : b + 1]) for b in range(3)])
    spec.close(batched, alone, kind="model", axes="b t v", behaviour="row b of a batch equals sequence b alone")


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("layout")
def test_forward_takes_ids_of_any_memory_layout(spec, family):
    """forward gives on non-contiguous ids (a slice ids[:, 1:], and ids stored transposed) the logits it gives on a
    contiguous copy of the same ids: a cached run's chunks and generate's window are such slices, and ``ids.view(-1)``
    raises on them (protocol: amendment 30)."""
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=7, device=spec.device))
    ids = ids_for(spec, config, b=3, seed=8)
    for what, view in (("a slice ids[:, 1:]", ids[:, 1:]), ("ids stored transposed", ids.t().contiguous().t())):
        spec.close(
            spec.impl.forward(model, view),
            spec.impl.forward(model, view.contiguous()),
            kind="model",
            axes="b t v",
            behaviour=f"forward of {what} (non-contiguous) equals forward of a contiguous copy",
        )


def loss_of(m, cfg, sd, ids):
    """``mean(forward(model, ids)**2)`` of a model built from ``sd`` (a float)."""
    return float(models.logits(m, cfg, sd, ids).detach().pow(2).mean())


@judges("build_model", uses=("forward", "canonical_state_dict"))
@pytest.mark.bug_class("tied_weights")
def test_tied_head_is_the_embedding_parameter(spec, family):
    """With tie_embeddings the LM head is the embedding Parameter itself, with gradients from both uses (symptoms
    table: weights copied, not shared). The parameter may hold more rows than the vocabulary (a vocabulary padded to
    a multiple of 128, as Megatron and nanoGPT pad it; amendment 16): the canonical weight is then a slice of it.

    The gradient is checked against a central difference of the model's own loss along random
    directions of the tied matrix, so this judges the tying whatever the rest of the model computes.
    """
    config = models.family_config(spec.impl, family, need=("tied_head",), tie_embeddings=True)
    sd = models.random_state_dict(config, seed=7, device=spec.device)
    model = models.build(spec.impl, config, sd)
    facts = spec.impl.parameter_facts(model)
    # the shape of the parameter holding the embedding: [V, d_model], or more rows for a padded vocabulary
    shape = (config["vocab_size"], config["d_model"])
    if facts["embedding"] is not None:
        shape = tuple(facts["shapes"][facts["embedding"]])
    v_by_d = [s for s in facts["shapes"] if tuple(s) == shape]
    two = len(v_by_d) == 2  # two such matrices: the head's own (none or more: another layout)
    copied = two and (facts["embedding"] is None or bool(facts.get("embedding_copies")))
    spec.require(
        len(v_by_d) == 1,
        behaviour=f"a tied model holds one {list(shape)} parameter (the embedding's)",
        found=f"it holds {len(v_by_d)}"
        + (": the head was copied, not shared" if copied else ": the head is one of its own" if two else ""),
        causes=(
            "likely cause: the LM head was given a copy of the embedding matrix. Fix: assign the "
            "same Parameter (lm_head.weight = tok_embeddings.weight)",
        )
        if copied
        else (
            "likely cause: the LM head is a parameter of its own that does not even hold the embedding's values: the "
            "tying is skipped (on the path that builds a model from given weights, or before loading replaced the "
            "embedding) and the head keeps its own initialisation. Fix: assign the same Parameter "
            "(lm_head.weight = tok_embeddings.weight) once the weights are loaded",
        )
        if two
        else (),
        codes=("knob:tying",) if two else (),
    )
    spec.require(
        facts["embedding"] is not None,
        behaviour="tok_embeddings.weight is a parameter of the model",
        found=(
            f"{facts['n_embedding_matches']} of the model's parameters hold canonical_state_dict's "
            "tok_embeddings.weight (its values, in order)"
        ),
    )
    ids = ids_for(spec, config, seed=8)
    grad = spec.impl.embedding_grad(model, ids)
    spec.require(grad is not None, behaviour="the tied matrix receives a gradient", found="its .grad is None")
    weight = sd["tok_embeddings.weight"]
    for k in range(2):
        direction = spec.inputs.randn(*weight.shape, seed=80 + k)

        def slope(h, direction=direction):  # central difference of the model's own loss along the direction
            at = [dict(sd, **{"tok_embeddings.weight": weight + s * h * direction}) for s in (1, -1)]
            return (loss_of(spec.impl, config, at[0], ids) - loss_of(spec.impl, config, at[1], ids)) / (2 * h)

        numeric = (4 * slope(5e-4) - slope(1e-3)) / 3  # Richardson: the h**2 error cancels
        analytic = float((grad.double() * direction).sum())
        # Measured: the reference agrees to 6e-6 relative, a float32-internal model to 4e-5 absolute; a
        # missing use (head or lookup) changes these directional derivatives by 0.03 to 0.5.
        tol = Tolerance(1e-4, 1e-3, "Richardson-extrapolated central difference, h = 1e-3", "finite difference")
        hint, code = None, ""
        if mismatch(analytic, numeric, tol) is not None:  # which use is missing, else which weights no gradient reaches
            hint, code = one_use(spec, config, sd, ids, direction, analytic)
            hint, code = (hint, code) if hint else gradient_cut(spec, config, sd, ids)
        spec.close(
            analytic,
            numeric,
            tol=tol,
            behaviour="the tied matrix's gradient is the derivative through both uses (lookup and LM head)",
            hint=hint
            or "likely cause (weak evidence): the gradient misses one of the tied matrix's two uses (the head uses "
            "a detached or copied matrix, or the lookup does not reach the parameter); a detach elsewhere in the "
            "model changes this derivative too. Fix: one Parameter, used by both",
            hint_code=code or "~knob:tying",
        )


def gradient_cut(spec, config, sd, ids) -> tuple[str | None, str]:
    """Which weights get no gradient at all from the implementation's own loss where the reference's gradient of the
    same loss reaches them: a part of forward cut from the graph (a detach, ``.data``, a cache write handed back
    detached, ``torch.no_grad`` around part of it), which changes every derivative that flows through it, the tied
    matrix's too. ``(None, "")`` where none is cut, or the gradients cannot be read."""
    from .harness.subject.subject import reference_subject

    impl = getattr(spec.impl, "_subject", spec.impl)  # a side measurement: no crash probing
    x, y = ids[:, :-1], ids[:, 1:]
    try:
        got = impl.cross_entropy_grads(models.build(impl, config, sd), x, y)["grads"]
        ref = reference_subject(impl.rope_style)
        want = ref.cross_entropy_grads(models.build(ref, config, sd), x, y)["grads"]
    except Exception:  # noqa: BLE001 - gradients that cannot be read name nothing
        return None, ""
    cut = sorted(
        k
        for k, g in got.items()
        if (g is None or not g.any()) and want.get(k) is not None and float(want[k].abs().max()) > 1e-8
    )
    if not cut:
        return None, ""
    return (
        f"likely cause: no gradient reaches {', '.join(cut)} (none, or exactly zero, where the specified model's "
        "loss depends on them): part of forward is cut from the graph there (a .detach() or .data, a cache write "
        "handed back detached, torch.no_grad around part of it), which changes the tied matrix's derivative too, or "
        "the weight is no Parameter of the model. Fix: keep forward's computation in the graph (detach only what is "
        "stored for later calls, not what this call uses)",
        "knob:detached",
    )


def one_use(spec, config, sd, ids, direction, analytic: float) -> tuple[str | None, str]:
    """Which one of the tied matrix's two uses its gradient holds, measured on the implementation itself: the same
    weights built untied (the head a second matrix of the same values, the same function), each matrix moved alone
    along ``direction`` (central differences, as the test's own). Where the tied gradient's directional derivative is
    one use's alone and not the other's, that names the use that does not reach the parameter; ``(None, "")`` where
    neither or both fit, or the implementation builds no untied model."""
    untied = dict(config, tie_embeddings=False)
    weights = dict(sd, **{"lm_head.weight": sd["tok_embeddings.weight"].clone()})
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side measurement: no crash probing

    def slope(name, h):
        at = [dict(weights, **{name: weights[name] + s * h * direction}) for s in (1, -1)]
        return (loss_of(impl, untied, at[0], ids) - loss_of(impl, untied, at[1], ids)) / (2 * h)

    try:
        lookup, head = ((4 * slope(n, 5e-4) - slope(n, 1e-3)) / 3 for n in ("tok_embeddings.weight", "lm_head.weight"))
    except Exception:  # noqa: BLE001 - an implementation without untied models, or one that raises: not measured
        return None, ""
    tol = Tolerance(1e-4, 1e-3, "Richardson-extrapolated central difference, h = 1e-3", "finite difference")
    fits = {use: mismatch(analytic, part, tol) is None for use, part in (("lookup", lookup), ("head", head))}
    if fits["lookup"] == fits["head"]:
        return None, ""
    kept, lost = ("lookup", "LM head") if fits["lookup"] else ("LM head", "lookup")
    return (
        f"likely cause: the tied matrix's gradient is its {kept}'s part alone (measured: the same weights built "
        f"untied, each matrix moved alone): the {lost}'s use of it does not reach the parameter (a detached or copied "
        "matrix there). Fix: one Parameter, used by both, with no detach",
        "knob:tying",
    )


INIT_CONFIG = dict(
    models.LLAMA_GQA, d_model=256, n_heads=8, n_kv_heads=2, d_ff=320, n_layers=4, vocab_size=300, tie_embeddings=False
)
RESIDUAL = ("attn.wo.weight", "mlp.w_down.weight", "mlp.w_proj.weight")


@judges("build_model", uses=("canonical_state_dict",))
@pytest.mark.bug_class("init")
def test_initialisation_statistics(spec, family):
    """Fresh weights ~ N(0, 0.02), residual projections ~ N(0, 0.02/sqrt(2 n_layers)), norm weights 1, biases 0 (course
    notes: init std, residual projection scale)."""
    base = INIT_CONFIG if family == "llama" else dict(INIT_CONFIG, family="gpt2", n_kv_heads=8)
    config = models.supported(spec.impl, base)
    sd = spec.impl.canonical_state_dict(spec.impl.build(config, None, seed=0))
    residual_std = 0.02 / math.sqrt(2 * config["n_layers"])
    apart = unscaled_apart(sd, residual_std)
    offsets = models.offset_norm_names(config) if config.get("norm_offset") else set()  # amendment 26: gain 1 + w
    for name, w in sd.items():
        if name in offsets:
            spec.require(bool((w == 0).all()), behaviour="norm offsets start at 0", found=f"{name} is not all 0")
        elif name.endswith("norm.weight"):
            spec.require(bool((w == 1).all()), behaviour="norm weights start at 1", found=f"{name} is not all 1")
        elif name.endswith(".bias"):
            spec.require(bool((w == 0).all()), behaviour="biases start at 0", found=f"{name} is not all 0")
        else:
            want = residual_std if name.endswith(RESIDUAL) else 0.02
            n = w.numel()
            # The sample std of n normal draws has relative standard error 1/sqrt(2n) (<= 0.9% here,
            # n >= 6400); 6% is >= 6.7 standard errors, and the residual/plain ratio is sqrt(8) = 2.8x.
            got = w.double().std().item()
            found = f"std {got:.4g} over {n} entries (expected {want:.4g} ± 6%)"
            why = f"{name} is drawn with the wrong standard deviation"
            if want != 0.02:
                by_layer = residual_stds(sd, name)
                found += "; this projection's std by layer: " + ", ".join(f"{v:.4g}" for v in by_layer.values())
                why = residual_scale_reading(by_layer, config["n_layers"], got, apart) or why
            spec.require(
                abs(got / want - 1) < 0.06,
                behaviour=f"{name} ~ N(0, {want:.4g})" + (" (residual projection)" if want != 0.02 else ""),
                found=found,
                causes=(
                    f"likely cause: {why}. Fix: N(0, 0.02) for Linear/Embedding weights, N(0, 0.02/sqrt(2 n_layers)) "
                    "for wo, w_down, w_proj, the same in every layer",
                ),
                codes=("knob:init_std",),
            )
            mean = w.double().mean().item()
            spec.require(
                abs(mean) < 6 * want / math.sqrt(n),
                behaviour=f"{name} has mean 0",
                found=f"mean {mean:.3g} (6 standard errors: {6 * want / math.sqrt(n):.3g})",
            )


@judges("build_model", uses=("canonical_state_dict",))
@pytest.mark.bug_class("init")
def test_fresh_weights_are_drawn_independently(spec, family):
    """Each fresh weight is a draw of its own (protocol: build_model, every Linear/Embedding weight ~ N(0, 0.02)): no
    two weight matrices of a fresh model hold the same values. Held out: a JAX-style initialisation that reused one
    PRNG key, so wq was the same in every layer and w_gate equalled w_up, each with the right mean and std."""
    base = INIT_CONFIG if family == "llama" else dict(INIT_CONFIG, family="gpt2", n_kv_heads=8)
    config = models.supported(spec.impl, base)
    model = spec.impl.build(config, None, seed=0)
    sd = spec.impl.canonical_state_dict(model)
    drawn = {n: w for n, w in sd.items() if not n.endswith(("norm.weight", ".bias")) and w.numel() > 1}
    names = list(drawn)
    same = [
        (a, b)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if drawn[a].shape == drawn[b].shape and torch.equal(drawn[a], drawn[b])
    ]
    causes, codes = (
        (
            "likely cause: one random stream is restarted for each weight (a PRNG key used again without splitting, a "
            "generator seeded anew before each draw), or one drawn tensor copied into several weights. Fix: draw every "
            "weight from one advancing generator (split the key once per weight)",
        ),
        ("knob:init_std",),
    )
    shared = [set(g) for g in spec.impl.shared_canonical_names(model)] if same else []
    if same and all(any({a, b} <= g for g in shared) for a, b in same):  # one parameter: equal, however it is drawn
        causes, codes = (
            (
                "likely cause: each equal pair is one parameter of your model under two canonical names (one module "
                "put in several places), not two draws: test_each_canonical_weight_has_a_parameter_of_its_own says "
                "which. Fix: create a new module for each place",
            ),
            ("knob:layer_weights",),
        )
    spec.require(
        not same,
        behaviour="no two fresh weight matrices are equal (each is drawn on its own)",
        found=f"{len(same)} pairs hold the same values: "
        + ", ".join(f"{a} == {b}" for a, b in same[:4])
        + (" ..." if len(same) > 4 else ""),
        causes=causes,
        codes=codes,
    )


def residual_stds(sd: dict, name: str) -> dict[int, float]:
    """The std of the residual projection ``name`` (``layers.{i}.<suffix>``) in every layer, by layer index."""
    suffix = name.split(".", 2)[2]
    return {
        int(k.split(".")[1]): v.double().std().item()
        for k, v in sd.items()
        if k.startswith("layers.") and k.split(".", 2)[2] == suffix
    }


def unscaled_apart(sd: dict, residual_std: float) -> tuple[list[str], list[str]]:
    """``(unscaled, scaled)``: the residual projections (``RESIDUAL``, by canonical suffix) drawn at 0.02 in every
    layer, and those drawn at ``residual_std`` in every layer, each within 6%."""
    found: dict[str, list[float]] = {}
    for k, v in sd.items():
        suffix = k.split(".", 2)[2] if k.startswith("layers.") else ""
        if suffix in RESIDUAL:
            found.setdefault(suffix.removesuffix(".weight"), []).append(v.double().std().item())
    at = lambda stds, std: all(abs(s / std - 1) < 0.06 for s in stds)
    return [k for k, s in found.items() if at(s, 0.02)], [k for k, s in found.items() if at(s, residual_std)]


def residual_scale_reading(by_layer: dict[int, float], n_layers: int, got: float, apart=((), ())) -> str | None:
    """What scale the residual projections' stds ``by_layer`` show, where one rule fits every layer within 6%: none
    (0.02), or a depth the layer's own index gives (TorchTitan's depth_init: 0.02/sqrt(2 (i + 1))). ``apart``: the
    projections at 0.02 and those scaled right (``unscaled_apart``): where some are scaled, the others are named."""

    def every(rule) -> bool:
        return len(by_layer) == n_layers and all(abs(v / rule(i) - 1) < 0.06 for i, v in by_layer.items())

    unscaled, scaled = apart
    if abs(got / 0.02 - 1) < 0.06 and unscaled and scaled:
        return (
            f"{' and '.join(unscaled)} {'is' if len(unscaled) == 1 else 'are'} not scaled by 1/sqrt(2 n_layers) while "
            f"{' and '.join(scaled)} {'is' if len(scaled) == 1 else 'are'}: the scaled init is applied by name to "
            "some residual projections only (GPT-2's rule for c_proj carried over to one of the projections that "
            "write to the residual stream)"
        )
    if abs(got / 0.02 - 1) < 0.06:
        return "the residual projections are not scaled by 1/sqrt(2 n_layers)"
    if n_layers > 1 and every(lambda i: 0.02 / math.sqrt(2 * (i + 1))):
        return (
            "the residual projections are scaled by each layer's own depth, 0.02/sqrt(2 (layer + 1)), instead of "
            "the model's, 0.02/sqrt(2 n_layers) in every layer (a depth-scaled init keyed on the layer index)"
        )
    if every(lambda i: 0.02 / math.sqrt(n_layers)):
        return "the residual projections are scaled by 1/sqrt(n_layers), without the 2 (two residual adds per layer)"
    return None


def held_apart(config: dict, diff: int) -> str | None:
    """What a model holding ``diff`` parameters more than its config's weights holds besides, where exactly one of the
    usual shapes gives that count: a bias on the output head (vocab_size), one vector of d_model, such a vector in
    every block; None otherwise (and for fewer: build_model's tests name a missing weight)."""
    d, v, n = config["d_model"], config["vocab_size"], config["n_layers"]
    shapes = {
        v: "bias on the output head, [vocab_size] (the protocol's head has none: a checkpoint's lm_head bias kept)",
        d: "vector of d_model (a bias or a norm gain the protocol's model does not have)",
        n * d: "vector of d_model in every block (a bias on a projection the family has none on, or a norm)",
    }
    if diff <= 0 or len(set(shapes)) != len(shapes) or diff not in shapes:
        return None
    return f"{diff} more than the config's weights: an extra {shapes[diff]}"


@judges("count_parameters", uses=("build_model",))
@pytest.mark.bug_class("tied_weights")
def test_count_parameters(spec, config):
    """count_parameters counts unique parameters, a tied matrix once (protocol: count_parameters)."""
    sd = models.random_state_dict(config, seed=9, device=spec.device)
    model = models.build(spec.impl, config, sd)
    got = spec.impl.count_parameters(model)
    want = sum(t.numel() for t in sd.values())  # canonical names list a tied matrix once
    held = spec.impl.parameter_count(model) if got != want else want  # what the model holds, counted by the suite
    # a count that is right for a model holding other parameters: the model, not the count, differs
    variants = count_variants({k: t.numel() for k, t in sd.items()}, want) if got != held else ()
    hint = None
    if got == held != want:
        hint = (
            f"note: your count equals the unique parameters your model holds ({held}); the config's weights are "
            f"{want}, so the model holds other parameters than the config asks for (a weight missing, or one matrix "
            "shared where the config unties it, or two where it ties it): see build_model's and "
            "canonical_state_dict's tests"
        )
        extra = held_apart(config, held - want)
        if extra:
            hint = (
                f"likely cause: your count equals the unique parameters your model holds ({held}), {extra}. Fix: "
                "build exactly the config's weights (canonical_state_dict's names)"
            )
    spec.close(
        got,
        want,
        tol=EXACT,
        variants=variants,
        hint=hint,
        hint_code="knob:bias" if hint and hint.startswith("likely cause") else None,
        behaviour="count_parameters = number of unique weights",
        rebase=(("build_model",), lambda: spec.impl.parameter_count(model)),  # counts right what the model holds
    )


GPT2_SMALL = dict(
    family="gpt2",
    vocab_size=50257,
    context_length=1024,
    d_model=768,
    n_layers=12,
    n_heads=12,
    n_kv_heads=12,
    d_ff=3072,
    tie_embeddings=True,
)


@judges("count_parameters", uses=("build_model",))
def test_count_parameters_gpt2_small_on_meta(spec):
    """GPT-2 small built on the meta device has 124,439,808 parameters (protocol: count_parameters; course notes: about
    124M)."""
    spec.impl.require_family("gpt2")
    spec.impl.require_capability("tied_head")
    model = spec.impl.build(GPT2_SMALL, None, device="meta", dtype="float32")
    got = spec.impl.count_parameters(model)
    sizes = {name: math.prod(shape) for name, shape in models.canonical_shapes(GPT2_SMALL).items()}
    variants = count_variants(sizes, 124_439_808)
    spec.close(
        got,
        124_439_808,
        tol=EXACT,
        variants=variants,
        behaviour="count_parameters(GPT-2 small) = 124,439,808",
        rebase=(("build_model",), lambda: spec.impl.parameter_count(model)),
    )


@judges("kv_cache_bytes")
@pytest.mark.bug_class("memory")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
def test_kv_cache_bytes(spec, dtype):
    """kv_cache_bytes = 2 * n_layers * n_kv_heads * d_head * seq_len * batch * element size (course notes: KV bytes per
    token per layer; why GQA: it cuts KV cache memory by N/G)."""
    variants = dict(CONFIGS, llama_mqa_3_layers=dict(models.LLAMA_GQA, n_layers=3, n_kv_heads=1))
    variants = {k: v for k, v in variants.items() if v["family"] in spec.impl.families}  # judged as it is supported
    if "gqa" not in spec.impl.capabilities:
        variants = {k: v for k, v in variants.items() if models.n_kv(v) == v["n_heads"]}
    for name, cfg in variants.items():
        got = spec.impl.kv_cache_bytes(cfg, 3, 17, dtype)
        want = spec.expected(lambda m, c: m.kv_cache_bytes(c, 3, 17, dtype), cfg, label=name)
        heads = cfg["n_heads"] * want // (cfg.get("n_kv_heads") or cfg["n_heads"])
        variants = [
            Variant(
                "scale",
                "only K or only V is counted (no factor 2)",
                "2 * n_layers * n_kv_heads * d_head * seq_len * batch * element size",
                lambda want=want: want // 2,
            ),
            Variant(
                "scale",
                "the query heads are counted instead of the key/value heads (no GQA saving)",
                "use n_kv_heads",
                lambda heads=heads: heads,
            ),
            Variant(
                "scale",
                "the element size is taken as 4 bytes whatever the dtype",
                "element_size of the dtype",
                lambda want=want: want * 4 // torch.empty((), dtype=dtype).element_size(),
            ),
            Variant(
                "scale",
                "the element size is counted in bits, not bytes (8 times the bytes: a dtype's size in bits, as "
                "Keras' dtype_size or torch.finfo(dtype).bits give it)",
                "element size in bytes: torch.empty((), dtype=dtype).element_size() (bits // 8)",
                lambda want=want: want * 8,
            ),
            *(
                Variant(
                    "scale",
                    f"{wrong} is counted instead of seq_len (17)",
                    "count the seq_len positions asked for",
                    lambda want=want, n=n: want * n // 17,
                )
                for wrong, n in (("context_length", cfg["context_length"]), ("the batch size", 3))
            ),
        ]
        spec.close(
            got, want, tol=EXACT, variants=variants, behaviour=f"kv_cache_bytes({name}, batch 3, seq 17, {dtype})"
        )
        if dtype == torch.float32:  # the default dtype is float32 (protocol: kv_cache_bytes)
            spec.close(
                spec.impl.kv_cache_bytes(cfg, 3, 17),
                want,
                tol=EXACT,
                behaviour=f"kv_cache_bytes({name}, batch 3, seq 17) counts float32 elements by default",
            )


@judges("build_model")
@pytest.mark.bug_class("validation")
def test_config_errors_raise(spec, family):
    """d_model % n_heads != 0, n_heads % n_kv_heads != 0 and an odd RoPE head dim raise ValueError (symptoms table:
    ValueError on d_model and n_heads)."""
    base = models.family_config(spec.impl, family)
    bad = dict(base, d_model=base["d_model"] + 3)
    spec.raises(
        ValueError,
        lambda: spec.impl.build_model(bad),
        mention=(str(bad["d_model"]), str(base["n_heads"])),
        behaviour=f"d_model={bad['d_model']} with n_heads={base['n_heads']} raises ValueError",
    )
    if "gqa" in spec.impl.capabilities:
        bad_kv = dict(base, n_kv_heads=base["n_heads"] - 1)
        spec.raises(
            ValueError,
            lambda: spec.impl.build_model(bad_kv),
            mention=(str(base["n_heads"]), str(bad_kv["n_kv_heads"])),
            behaviour=f"n_heads={base['n_heads']} with n_kv_heads={bad_kv['n_kv_heads']} raises ValueError",
        )
    if family == "llama":
        odd = dict(base, d_model=3 * 8, n_heads=8, n_kv_heads=2 if "gqa" in spec.impl.capabilities else 8)
        spec.raises(
            ValueError,
            lambda: spec.impl.build_model(odd),
            mention=("3",),
            behaviour="an odd RoPE head dimension (d_head=3) raises ValueError",
        )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("validation")
def test_forward_past_context_raises(spec, family):
    """More than context_length tokens in one forward raise ValueError; exactly context_length are accepted (symptoms
    table: seq_len exceeds max_context_length)."""
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=10, device=spec.device))
    ctx = config["context_length"]
    ids = ids_for(spec, config, b=1, t=ctx + 1)
    spec.raises(
        ValueError,
        lambda: spec.impl.forward(model, ids),
        behaviour=f"{ctx + 1} tokens with context_length={ctx} raise ValueError",
        causes=(
            "likely cause: the context check is missing or off by one (T > context_length must fail). Fix: "
            "raise ValueError when the tokens in view exceed context_length",
        ),
        codes=("boundary",),
    )
    out = spec.impl.forward(model, ids[:, :ctx])
    spec.require(
        tuple(out.shape) == (1, ctx, config["vocab_size"]),
        behaviour="exactly context_length tokens are accepted",
        found=f"logits shape {tuple(out.shape)}",
    )
