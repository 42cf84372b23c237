"""Shared oracles for the reference's own checks: independent re-derivations built on torch.nn.functional.

Nothing here calls into ``reference``; these helpers are what the reference is compared *against*.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import ahead  # tests/ahead.py: tests/ is on sys.path while pytest imports this file
import manifest_cache  # tests/manifest_cache.py: the session's grading manifests
import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # plain `pytest tests` (rootdir insertion puts tests/ first, not the repo)
    sys.path.insert(0, str(ROOT))


def rope_complex(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, style: str = "interleaved"):
    """RoPE as complex multiplication: pair ``(a, b)`` -> ``(a + ib) * exp(i * pos * theta**(-2k/d))``.

    ``interleaved`` pairs channels ``(2k, 2k+1)``; ``half`` pairs ``(k, k + d/2)``. float64 throughout.
    """
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[..., None] * freqs
    rot = torch.polar(torch.ones_like(angle), angle)
    xd = x.to(torch.float64)
    if style == "interleaved":
        xc = torch.view_as_complex(xd.reshape(*xd.shape[:-1], d // 2, 2).contiguous())
        out = torch.view_as_real(xc * rot).reshape(xd.shape)
    else:
        xc = torch.complex(xd[..., : d // 2], xd[..., d // 2 :])
        z = xc * rot
        out = torch.cat((z.real, z.imag), dim=-1)
    return out.to(x.dtype)


def oracle_forward(sd: dict, cfg: dict, ids: torch.Tensor, rope_style: str = "interleaved") -> torch.Tensor:
    """The protocol's pre-norm decoder written with torch.nn.functional only; logits ``[B, T, V]``."""
    llama = cfg.get("family", "llama") == "llama"
    d, n_heads = cfg["d_model"], cfg["n_heads"]
    n_kv = cfg.get("n_kv_heads") or n_heads
    dh, eps, theta = d // n_heads, cfg.get("norm_eps", 1e-5), cfg.get("rope_theta", 10000.0)
    B, T = ids.shape

    def norm(x, prefix):
        if llama:
            return F.rms_norm(x, (d,), sd[prefix + ".weight"], eps)
        return F.layer_norm(x, (d,), sd[prefix + ".weight"], sd[prefix + ".bias"], eps)

    def lin(x, prefix):
        return F.linear(x, sd[prefix + ".weight"], sd.get(prefix + ".bias"))

    x = F.embedding(ids, sd["tok_embeddings.weight"])
    if not llama:
        x = x + F.embedding(torch.arange(T), sd["pos_embeddings.weight"])
    pos = torch.arange(T)
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        h = norm(x, p + "attn_norm")
        q = lin(h, p + "attn.wq").view(B, T, n_heads, dh).transpose(1, 2)
        k = lin(h, p + "attn.wk").view(B, T, n_kv, dh).transpose(1, 2)
        v = lin(h, p + "attn.wv").view(B, T, n_kv, dh).transpose(1, 2)
        if llama:
            q, k = rope_complex(q, pos, theta, rope_style), rope_complex(k, pos, theta, rope_style)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_kv != n_heads)
        x = x + lin(a.transpose(1, 2).reshape(B, T, n_heads * dh), p + "attn.wo")
        h = norm(x, p + "mlp_norm")
        if llama:
            m = lin(F.silu(lin(h, p + "mlp.w_gate")) * lin(h, p + "mlp.w_up"), p + "mlp.w_down")
        else:
            m = lin(F.gelu(lin(h, p + "mlp.w_fc"), approximate="tanh"), p + "mlp.w_proj")
        x = x + m
    x = norm(x, "final_norm")
    return F.linear(x, sd.get("lm_head.weight", sd["tok_embeddings.weight"]))


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> torch.nn.Module:
    """Overwrite every parameter with O(1)-logit random values (init's std 0.02 gives near-uniform
    logits, which would make agreement checks weak): matrices ~ N(0, scale), norm weights ~ 1 + N(0, 0.2),
    biases ~ N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        if "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.2 * r)
        elif name.endswith("bias"):
            p.copy_(0.1 * r)
        else:
            p.copy_(scale * r)
    return model


def tiny_config(family: str = "llama", **overrides) -> dict:
    """A small config with distinct sizes: V=37, ctx=16, d=48, H=8, Hkv=2 (n_rep 4), d_head=6, d_ff=40,
    2 layers (gpt2: Hkv = H); tests use batch 3."""
    cfg = dict(
        vocab_size=37, context_length=16, d_model=48, n_layers=2, n_heads=8, n_kv_heads=2, d_ff=40, family=family
    )
    if family == "gpt2":
        cfg["n_kv_heads"] = 8
    cfg.update(overrides)
    return cfg


def make_model(cfg: dict, seed: int = 0, dtype=torch.float64, rope_style: str = "interleaved"):
    """A reference model for ``cfg`` with randomized O(1) weights in ``dtype``, in eval mode."""
    import reference

    torch.manual_seed(seed)
    model = reference.build_model(cfg, rope_style=rope_style).to(dtype)
    return randomize_(model, seed).eval()


@pytest.fixture
def oracles():
    """The independent helpers above, as a namespace."""
    return types.SimpleNamespace(
        rope=rope_complex, forward=oracle_forward, randomize=randomize_, config=tiny_config, model=make_model
    )


@pytest.fixture(scope="session", autouse=True)
def _one_intra_op_thread():
    """Every tensor here is tiny; on a shared 2-core machine OpenMP's spinning worker threads made these
    tests 10-20x slower (a 40-step training test: 0.5 s alone, 23 s next to other jobs, 1.5 s single-threaded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _restore_default_dtype():
    """Tests may switch torch's default dtype; put it back afterwards."""
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


# Test files that run the suite or the grader in further processes (pytest, spec-grade, spec-handout,
# the sandboxed worker): the slow tier. `python -m pytest tests spec_tests -m "not slow"` is the quick
# tier (the README says how long each takes).
SLOW_FILES = {
    "test_ahead.py",
    "test_bug_catalog.py",
    "test_consequences.py",
    "test_cs336_bridge.py",
    "test_diagnosis_confirmation.py",
    "test_diagnosis_crashes.py",
    "test_diagnosis_wiring.py",
    "test_grading.py",
    "test_grading_assignment.py",
    "test_grading_attacks.py",
    "test_grading_consequences.py",
    "test_grading_fresh_inputs.py",
    "test_grading_gradescope.py",
    "test_grading_reports.py",
    "test_grading_staging.py",
    "test_handout.py",
    "test_judge_forkserver.py",
    "test_observation.py",
    "test_observed_modes.py",
    "test_ordering.py",
    "test_plugin.py",
    "test_protocol_map.py",
    "test_protocol_v2.py",
    "test_remote.py",
    "test_root_causes.py",
    "test_sandbox.py",
    "test_worker_limits.py",
}


MANIFEST_CACHE = pytest.StashKey[str | None]()


def pytest_configure(config):
    ahead.runner_count()  # a bad SPEC_TESTS_AHEAD is a usage error before anything runs
    # one manifest cache for every grading of the session, the runners' too (they inherit the environment)
    config.stash[MANIFEST_CACHE] = manifest_cache.start()


def pytest_unconfigure(config):
    manifest_cache.finish(config.stash.get(MANIFEST_CACHE, None))


def pytest_runtest_setup(item):
    if "pytester" in getattr(item, "fixturenames", ()):
        # An optimizer's first step imports torch._dynamo, whose import registers operator libraries with torch's
        # C++ core, once per process. Imported during an in-process suite run (tests/suite_subprocess.py), it would
        # leave sys.modules with pytester's snapshot when the test ends, and its import by the next test's run would
        # fail ("Only a single TORCH_LIBRARY can be used to register the namespace _inductor_test"): it is imported
        # here, before pytester's fixture takes that snapshot.
        import torch._dynamo  # noqa: F401


def pytest_collection_modifyitems(config, items):
    for item in items:
        in_slow_file = item.path.name in SLOW_FILES and item.path.parent == Path(__file__).parent
        if in_slow_file or getattr(getattr(item, "function", None), "run_ahead", False):  # a runner does it
            item.add_marker(pytest.mark.slow)
    # what waits on work done ahead runs last, so that the other tests run while runners do it
    items.sort(key=ahead.runs_last)


@pytest.fixture(scope="session", autouse=True)
def _build_ahead(request, tmp_path_factory):
    """Start the runners that do this session's work ahead (tests/ahead.py)."""
    jobs, count = ahead.wanted(request.session.items), ahead.runner_count()
    if not jobs or not count:
        yield
        return
    plan = ahead.Plan(tmp_path_factory.mktemp("ahead"), jobs)
    request.config.stash[ahead.PLAN] = plan
    plan.start(min(count, len(jobs)))
    yield
    plan.stop()
    del request.config.stash[ahead.PLAN]
