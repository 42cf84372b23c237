"""RoPE scaling for long context (protocol v2, capability ``rope_scaling``): Hugging Face's ``rope_scaling`` dicts
``linear``, ``dynamic``, ``llama3`` and ``yarn``, in ``rope(..., scaling=)`` and in the model's config."""

import math

import pytest
import torch

from . import models
from .harness.diagnosis.constant_fit import measured_rotation
from .harness.diagnosis.variant import Variant
from .harness.plugin.markers import judges
from .inputs import S

pytestmark = pytest.mark.component("positions")

# One scaling per type, with its original length L0 small enough that the suite's positions pass it. With
# d_head 10 and theta 10000 the pair wavelengths are 6.3, 40, 251, 1580 and 9952: llama3's L0 = 64 with
# low/high factors 1 and 4 (wavelength bounds 64 and 16) keeps pair 0, interpolates pair 1, divides pairs 2-4.
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
}
TYPES = list(SCALINGS)
FIX = {
    "linear": "divide the frequencies (or the positions) by factor, once",
    "llama3": "divide pairs of wavelength above L0 / low_freq_factor by factor, keep those below L0 / high_freq_factor",
    "yarn": "multiply cos and sin by the attention factor (0.1 ln(factor) + 1 unless attention_factor is given)",
    "dynamic": "scale by seq_len = max(positions) + 1, and only once it exceeds original_max_position_embeddings",
}


SWAP_FIX = "read each parameter of the rope_scaling dict under its own key"


def exchanged(kind: str) -> list[tuple[str, dict, str]]:
    """Every two numeric parameters of ``kind``'s dict with their values exchanged (llama3's low and high frequency
    factors, YaRN's beta_fast and beta_slow: two parameters of one formula read in each other's place)."""
    sc = SCALINGS[kind]
    numeric = [k for k, v in sc.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return [
        (f"the {kind} scaling reads {a} and {b} in each other's place (exchanged)", {a: sc[b], b: sc[a]}, SWAP_FIX)
        for i, a in enumerate(numeric)
        for b in numeric[i + 1 :]
        if sc[a] != sc[b]
    ]


def variants(kind: str, call, faster=None) -> list[Variant]:
    """The classic mistakes of ``kind``, as the reference computes them: ``call(ref, scaling_or_None, *args)``;
    ``faster(ref, m, *args)``: plain RoPE at the positions times ``m`` (a linear factor that multiplies)."""
    sc = SCALINGS[kind]
    changes = {
        "linear": [
            (
                "the linear factor is applied twice (to the positions and to the frequencies)",
                {"factor": 16.0},
                FIX[kind],
            ),
        ],
        "llama3": [],
        "yarn": [
            ("YaRN's attention factor (mscale) is not applied to cos and sin", {"attention_factor": 1.0}, FIX[kind])
        ],
        "dynamic": [],
    }[kind] + exchanged(kind)
    plain = f"the {kind} scaling is not applied: plain RoPE"
    if kind == "dynamic":
        plain += " (the length read is at most original_max_position_embeddings: the number of positions?)"
    return [
        *(
            Variant("knob:rope_scaling", summary, fix, lambda ref, *a, ch=change: call(ref, {**sc, **ch}, *a))
            for summary, change, fix in changes
        ),
        Variant("knob:rope_scaling", plain, FIX[kind], lambda ref, *a: call(ref, None, *a)),
        *(
            [  # mlx's RoPE(scale=) multiplies the positions: a linear factor passed as it is, not as 1 / factor
                Variant(
                    "knob:rope_scaling",
                    "the linear factor multiplies the positions instead of dividing them: the rotation runs factor "
                    "times faster, not slower",
                    FIX[kind],
                    lambda ref, *a: faster(ref, int(sc["factor"]), *a),
                )
            ]
            if kind == "linear" and faster is not None
            else []
        ),
    ]


def band_reading(spec, sc: dict, kind: str):
    """A reading for a failing scaled rope: each pair's angle per position, measured on the implementation and on the
    reference with the same ``rope_scaling`` (``constant_fit.measured_rotation``); where some pairs turn as specified
    and others not, the others are named with their wavelengths (llama3 treats three bands of wavelengths apart)."""

    def read(tol) -> tuple[list[str], list[str]]:
        ref = getattr(spec.expectations, "reference", None)
        raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
        if ref is None:
            return [], []
        style = spec.impl.rope_style
        try:
            mine = measured_rotation(lambda x, p: raw.rope(x, p, scaling=sc), S.D_HEAD, style)
            theirs = measured_rotation(lambda x, p: ref.rope(x, p, scaling=sc), S.D_HEAD, style)
        except Exception:  # noqa: BLE001 - a reading the implementation cannot run says nothing
            return [], []
        if mine is None or theirs is None or (mine[0] - theirs[0]).abs().max() > 1e-9:
            return [], []
        wrong = ((mine[1] - theirs[1]).abs() > 1e-6 * theirs[1].abs()).nonzero().flatten().tolist()
        if not wrong or len(wrong) == len(theirs[1]):
            return [], []
        said = ", ".join(
            f"pair {i} (wavelength {2 * math.pi * 10000.0 ** (2 * i / S.D_HEAD):.4g} unscaled) turns by "
            f"{float(mine[1][i]):.4g} per position, not {float(theirs[1][i]):.4g}"
            for i in wrong
        )
        return [
            f"likely cause: with rope_scaling {kind}, {said}; the other {len(theirs[1]) - len(wrong)} pairs "
            f"turn as specified. Look at how the scaling treats those wavelengths; fix: {FIX[kind]} "
            "(evidence: rope measured on unit vectors at positions 0 to 2, with and without your code)"
        ], ["knob:rope_scaling"]

    return read


def unit_pairs(spec, d: int) -> torch.Tensor:
    """``[d/2, 1, d]``: row i is the unit vector on pair i's first channel, in the declared style."""
    x = torch.zeros(d // 2, 1, d, dtype=torch.float64, device=spec.device)
    first = torch.arange(0, d, 2) if spec.impl.rope_style == "interleaved" else torch.arange(d // 2)
    x[torch.arange(d // 2), 0, first] = 1.0
    return x


def pair_angles(out: torch.Tensor, style: str) -> torch.Tensor:
    """The angle each unit row of ``unit_pairs`` was turned by: ``[d/2]``."""
    half = out.shape[-1] // 2
    a, b = (out[:, 0, 0::2], out[:, 0, 1::2]) if style == "interleaved" else (out[:, 0, :half], out[:, 0, half:])
    return torch.atan2(b.diagonal(), a.diagonal())


@judges("rope")
@pytest.mark.bug_class("rope_scaling")
@pytest.mark.parametrize("kind", TYPES)
def test_rope_scaling_matches_reference(spec, kind):
    """rope(x, positions, scaling=<Hugging Face rope_scaling dict>) rotates by the scaled frequencies (YaRN: times
    its attention factor) at positions before and far beyond original_max_position_embeddings (protocol: amendment
    20)."""
    spec.impl.require_capability(f"rope_scaling:{kind}")
    sc = SCALINGS[kind]
    x = spec.inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=141)
    high = 4 * sc.get("original_max_position_embeddings", 16)
    pos = spec.inputs.scattered_positions(S.T, seed=142, high=high)
    pos[0] = high - 1  # the longest context in view: dynamic scales by high, whatever the draw
    spec.check(
        lambda m, x: m.rope(x, pos, scaling=sc),
        x,
        subject="rope",
        kind="positions",
        axes="b h t d",
        variants=variants(kind, lambda ref, s, x: ref.rope(x, pos, scaling=s), lambda ref, m, x: ref.rope(x, pos * m)),
        readings=[band_reading(spec, sc, kind)],
        behaviour=f"rope with rope_scaling {sc} at positions {sorted(pos.tolist())}",
    )


@judges("rope")
@pytest.mark.bug_class("rope_scaling")
@pytest.mark.parametrize("kind", TYPES)
def test_rope_scaling_takes_the_legacy_type_key(spec, kind):
    """A rope_scaling dict that spells its type with the legacy key "type" (older Hugging Face configs) scales as the
    same dict with "rope_type" does (protocol: amendment 20, '"type" is accepted for "rope_type"')."""
    spec.impl.require_capability(f"rope_scaling:{kind}")
    legacy = {("type" if k == "rope_type" else k): v for k, v in SCALINGS[kind].items()}
    x = spec.inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=146)
    pos = spec.inputs.scattered_positions(S.T, seed=147, high=4 * legacy.get("original_max_position_embeddings", 16))
    spec.check(
        lambda m, x: m.rope(x, pos, scaling=legacy),
        x,
        subject="rope",
        kind="positions",
        axes="b h t d",
        readings=[band_reading(spec, legacy, kind)],
        behaviour=f"rope with the legacy rope_scaling {legacy} (type for rope_type)",
    )


@judges("rope")
@pytest.mark.bug_class("rope_scaling")
@pytest.mark.parametrize("kind", ["linear", "llama3", "yarn"])
def test_rope_scaling_frequencies(spec, kind):
    """With a position-independent scaling, pair i turns by its scaled inverse frequency per position: linear divides
    every frequency by factor, llama3 keeps short wavelengths, divides long ones and interpolates between, YaRN
    ramps between the two (protocol: amendment 20)."""
    spec.impl.require_capability(f"rope_scaling:{kind}")
    sc = SCALINGS[kind]
    one = torch.ones(1, dtype=torch.long, device=spec.device)
    style = spec.impl.rope_style

    def angles(m, x, scaling=sc):
        return pair_angles(m.rope(x, one, scaling=scaling), style)

    spec.check(
        angles,
        unit_pairs(spec, S.D_HEAD),
        subject="rope",
        kind="positions",
        variants=variants(
            kind, lambda ref, s, x: angles(ref, x, s), lambda ref, m, x: pair_angles(ref.rope(x, one * m), style)
        ),
        behaviour=f"angle of each pair at position 1 under {sc}",
    )


@judges("rope")
@pytest.mark.bug_class("rope_scaling")
def test_dynamic_scaling_follows_the_sequence_length(spec):
    """Dynamic (NTK) scaling reads its length from the positions, seq_len = max(positions) + 1: up to
    original_max_position_embeddings it is plain RoPE, past it the base grows with seq_len, so the same position
    turns differently in a longer sequence (protocol: amendment 20)."""
    spec.impl.require_capability("rope_scaling:dynamic")
    sc = SCALINGS["dynamic"]
    x = spec.inputs.per_head(1, 2, 6, S.D_HEAD, seed=143)
    short = torch.tensor([0, 3, 7, 9, 12, 15], device=spec.device)  # seq_len 16 = original: unscaled
    spec.close(
        spec.impl.rope(x, short, scaling=sc),
        spec.impl.rope(x, short),
        kind="positions",
        axes="b h t d",
        behaviour="dynamic scaling at positions up to original_max_position_embeddings - 1 equals plain RoPE",
        hint="likely cause (weak evidence): dynamic scaling is applied whatever the length (its base grows before "
        "seq_len exceeds original_max_position_embeddings), or the scaled path computes even plain RoPE "
        "differently. Fix: " + FIX["dynamic"],
        hint_code="~knob:rope_scaling",
    )
    for longest in (40, 90):  # the same six positions, in sequences of two lengths past the original
        pos = torch.cat([short[:-1], torch.tensor([longest - 1], device=spec.device)])
        spec.check(
            lambda m, x, pos=pos: m.rope(x, pos, scaling=sc),
            x,
            subject="rope",
            kind="positions",
            axes="b h t d",
            label=f"seq_len_{longest}",
            variants=variants("dynamic", lambda ref, s, x, pos=pos: ref.rope(x, pos, scaling=s)),
            behaviour=f"dynamic scaling with seq_len = max(positions) + 1 = {longest} (6 positions: not their count)",
        )


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("rope_scaling")
@pytest.mark.parametrize("kind", TYPES)
def test_model_honours_rope_scaling(spec, kind):
    """A llama config's rope_scaling (a Hugging Face dict) scales the model's RoPE: logits of 29 tokens, past
    original_max_position_embeddings where the type has one below it, and for dynamic scaling of 9 tokens too,
    within it, where it is plain RoPE (protocol: amendment 20)."""
    spec.impl.require_capability(f"rope_scaling:{kind}")
    config = models.family_config(spec.impl, "llama", rope_scaling=SCALINGS[kind])
    sd = models.random_state_dict(config, seed=144, device=spec.device)
    plain = dict(config, rope_scaling=None)
    factored = []  # YaRN's attention factor f applied otherwise: scores carry f ** 2 as q and k carry f each
    if kind == "yarn":
        f = 0.1 * math.log(SCALINGS[kind]["factor"]) + 1  # the default attention factor (mscale)
        factored = [
            Variant(
                "knob:rope_scaling",
                f"YaRN's attention factor {f:.4g} is applied {how}",
                "multiply cos and sin by the attention factor once, and leave the softmax scale at 1 / sqrt(d_head)",
                lambda ref, sd, ids, a=a: models.logits(
                    ref, dict(config, rope_scaling={**SCALINGS[kind], "attention_factor": a}), sd, ids
                ),
            )
            for how, a in (
                ("twice: on cos and sin, and again on the softmax scale (the scores carry f ** 4, not f ** 2)", f**2),
                (
                    "to the scores once (the softmax scale) instead of to cos and sin: the scores carry f, not f ** 2",
                    f**0.5,
                ),  # fmt: skip
                ("nowhere: cos and sin are not multiplied by it", 1.0),
            )
        ]
    for t in (config["context_length"], *((9,) if kind == "dynamic" else ())):
        ids = spec.inputs.token_ids(2, t, vocab=config["vocab_size"], seed=145)
        models.check_option_logits(
            spec,
            config,
            sd,
            ids,
            label=f"T={t}",
            variants=[
                Variant(
                    "knob:rope_scaling",
                    "the model ignores config rope_scaling (plain RoPE)",
                    "pass the config's rope_scaling to every attention layer's RoPE",
                    lambda ref, sd, ids: models.logits(ref, plain, sd, ids),
                ),
                *factored,
            ],
            behaviour=f"logits of a llama model with rope_scaling {SCALINGS[kind]} for {t} tokens",
        )


@judges("rope")
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize(
    "bad,value",
    [
        ({"rope_type": "cubic", "factor": 2.0}, "cubic"),
        ({"factor": 0.5}, "0.5"),  # in the first type the implementation holds
    ],
    ids=["unknown_type", "factor_below_1"],
)
def test_rope_scaling_rejects_bad_dicts(spec, bad, value):
    """An unknown rope_type or a factor below 1 raises ValueError (protocol: amendment 20). The factor is tried in a
    type the implementation holds (``rope_scaling:<type>``): a code with YaRN alone need not take a linear dict."""
    spec.impl.require_capability("rope_scaling")
    if "rope_type" not in bad:
        held = next(t for t in TYPES if f"rope_scaling:{t}" in spec.impl.capabilities)
        bad = {**SCALINGS[held], **bad}
    x = spec.inputs.per_head(1, 1, 3, S.D_HEAD, seed=146)
    spec.raises(
        ValueError,
        lambda: spec.impl.rope(x, torch.arange(3, device=spec.device), scaling=bad),
        behaviour=f"rope(scaling={bad}) raises ValueError",
        mention=(value,),
    )
