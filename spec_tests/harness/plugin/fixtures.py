"""The suite's fixtures (imported by ``spec_tests/conftest.py``, so they exist only under spec_tests/)."""

from __future__ import annotations

import pytest
import torch

from ..judging.spec import Spec
from .hooks import session_of, test_id


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (``--impl``), as a Subject."""
    return session_of(request.config).impl


@pytest.fixture(scope="session")
def device(request) -> str:
    return session_of(request.config).device


@pytest.fixture
def spec(request, impl, device):
    """Per-test access to the implementation, expected values and comparisons."""
    from . import markers

    state = session_of(request.config)
    run = getattr(request.node, "_spec_run", None)
    subjects, _ = markers.subjects_of(request.node)
    return Spec(
        impl,
        state.expectations,
        device,
        test_id(request.node),
        markers.component_of(request.node),
        subjects,
        sink=run.results if run is not None else None,
        failing=state.registry.behaving_wrongly,
        upstream=state.registry.upstream_of,
        rounding_upstream=state.registry.rounding_upstream_of,
        crash_consequences=state.registry.crash_consequences,
        charged_upstream=state.registry.charged_upstream,
    )


@pytest.fixture(params=("llama", "gpt2"))
def family(request, impl):
    """Both model families; a family missing from the implementation's FAMILIES is skipped."""
    impl.require_family(request.param)
    return request.param


@pytest.fixture(params=[torch.float64, torch.float32], ids=["f64", "f32"])
def dtype(request):
    """float64 and float32 inputs: the math is judged at the same tolerance in both."""
    return request.param
