"""spec_tests/harness/remote/client.py and server.py: the judge's requests to a worker running a toy
implementation (tests/remote_toy_impl.py), in the sandbox where one is available."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from spec_tests.harness.diagnosis.crash_site import site_lines
from spec_tests.harness.remote import wire
from spec_tests.harness.remote.client import (
    RemoteError,
    RemoteHandle,
    RemoteImportError,
    StaleHandleError,
    Worker,
    WorkerCrashed,
    WorkerTimeout,
)
from spec_tests.harness.subject.subject import ImplementationError

HERE = Path(__file__).resolve().parent
TOY = HERE / "remote_toy_impl.py"
OPS = HERE / "remote_ops_fixture.py"


@pytest.fixture(scope="module")
def worker():
    w = Worker(TOY, ops=OPS, memory_mb=3072, call_timeout=30)
    w.start()
    yield w
    w.close()


def soon(seconds: float = 20.0) -> float:
    return time.monotonic() + seconds


def test_hello_describes_the_implementation(worker):
    assert worker.label.endswith("remote_toy_impl.py")
    assert {"softmax", "cross_entropy", "build_model", "sample", "generate"} <= worker.names
    assert "lm_loss" not in worker.names and "rope" not in worker.names
    attributes = worker.attributes
    assert attributes["ROPE_STYLE"] == "half" and attributes["FAMILIES"] == ("llama",)
    assert attributes["CAPABILITIES"] == ["gqa", "tied_head"]  # a set arrives sorted
    assert worker.provides("softmax") and not worker.provides("rope")


def test_a_correct_function_returns_exact_plain_tensors(worker):
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        x = torch.randn(3, 5, dtype=torch.float64).to(dtype)
        out = worker.call("softmax", (x,), {"dim": -1}, deadline=soon())
        assert type(out) is torch.Tensor and out.dtype == dtype
        assert torch.equal(out, torch.softmax(x, -1))


def test_not_implemented_is_reported_with_where(worker):
    with pytest.raises(RemoteError) as info:
        worker.call("layernorm", (1, 2, 3), deadline=soon())
    err = info.value
    assert err.not_implemented and err.is_a(NotImplementedError) and err.type == "NotImplementedError"
    assert err.message == "layernorm is still to do"
    assert err.where.startswith("remote_toy_impl.py:") and err.where.endswith(" in layernorm")


def test_an_error_carries_what_its_line_held_and_the_judge_reads_it(worker):
    """A crash's raising line is read in the worker (``crash_site.read_site``) and sent with the error, so the judge
    names a remote crash's cause as it names a local one."""
    with pytest.raises(RemoteError) as info:
        worker.call("gelu_mlp", (torch.ones(2, 3), torch.ones(4, 3), None, None, None), deadline=soon())
    site = info.value.site
    assert site["where"].startswith("remote_toy_impl.py:") and site["function"] == "gelu_mlp"
    assert site["source"] == "return x.shape[-1] // groups" and site["types"][0] == "ZeroDivisionError"
    groups = next(e for e in site["names"] if e["name"] == "groups")
    assert groups["zero"] and groups["text"] == "0" and not groups["none"]
    error = ImplementationError("gelu_mlp", ("ZeroDivisionError",), info.value.message, info.value.where, site=site)
    lines, codes = site_lines("gelu_mlp", error)
    assert codes == ["crash_zero_divisor"] and "`groups`" in lines[0] and "remote_toy_impl.py:" in lines[0]

    with pytest.raises(RemoteError) as info:
        worker.call("swiglu", (torch.ones(2, 3), None, None, None), deadline=soon())
    lines, codes = site_lines("swiglu", ImplementationError("swiglu", ("AttributeError",), "", site=info.value.site))
    assert codes == ["crash_none_value"] and "`config` None" in lines[0]


def test_a_site_record_out_of_shape_is_refused_and_its_text_made_plain():
    """The worker runs the submission's code: its site record is data, checked field by field like the rest of the
    error report."""
    good = {
        "where": "sub.py:3",
        "function": "f",
        "source": "return a / n",
        "types": ["ZeroDivisionError"],
        "message": "division by zero",
        "key": None,
        "guard": None,
        "names": [{"name": "n\x1b[2J", "text": "0", "none": False, "zero": True, "empty": None}],
    }
    report = {"type": "ZeroDivisionError", "mro": [], "message": "m", "where": None, "not_implemented": False}
    error = RemoteError.from_data({**report, "site": good})
    assert error.site["names"][0]["name"] == "n" and error.site["where"] == "sub.py:3"
    assert RemoteError.from_data(report).site is None  # a worker that sends none
    for bad in (
        {**good, "extra": 1},
        {**good, "where": 3},
        {**good, "types": ["x"] * 40},
        {**good, "names": [{"name": "n", "none": "yes", "zero": False}]},
        {**good, "names": [{"name": "n", "none": False, "zero": False, "keys": [1]}]},
        {**good, "names": [{"name": "n", "none": False, "zero": False, "run": "code"}]},
    ):
        with pytest.raises(wire.WireError):
            RemoteError.from_data({**report, "site": bad})


def test_an_exception_that_cannot_be_printed(worker):
    with pytest.raises(RemoteError) as info:
        worker.call("linear", (1, 2), deadline=soon())
    err = info.value
    assert err.message == "<unprintable _Unprintable>" and err.is_a(ValueError) and not err.not_implemented
    assert err.mro[0].endswith("._Unprintable") and "builtins.ValueError" in err.mro


def test_too_much_memory_is_an_error_and_the_worker_lives_on(worker):
    generation = worker.generation
    with pytest.raises(RemoteError) as info:
        worker.call("embedding", (1, 2), deadline=soon())
    assert "allocate" in info.value.message
    assert worker.ping(deadline=soon())["pid"] == worker.pid and worker.generation == generation


def test_a_lying_tensor_subclass_arrives_as_its_true_bytes(worker):
    out = worker.call("sinusoidal_positions", (2, 3), deadline=soon())
    assert type(out) is torch.Tensor
    assert torch.equal(out, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert not torch.equal(out, torch.zeros(2, 3))


def test_an_int_that_claims_to_equal_anything_arrives_as_a_plain_int(worker):
    out = worker.call("kv_cache_bytes", ({}, 1, 2), deadline=soon())
    assert type(out) is int and out == 5 and out != 124439808


def test_objects_stay_in_the_worker_as_handles(worker):
    model = worker.call("build_model", ({"d": 3},), deadline=soon())
    assert isinstance(model, RemoteHandle) and model.kind == "module" and model.type.endswith("Linear")
    assert model.generation == worker.generation
    assert worker.call("count_parameters", (model,), deadline=soon()) == 9
    state = worker.call("canonical_state_dict", (model,), deadline=soon())
    assert list(state) == ["weight"] and type(state["weight"]) is torch.Tensor and state["weight"].shape == (3, 3)
    facts = worker.op("parameter_facts", (model,), deadline=soon())
    assert facts == {"weight": ((3, 3), torch.float32, True)}
    model64 = worker.op("build", ({"d": 2}, torch.float64), deadline=soon())
    assert worker.op("parameter_facts", (model64,), deadline=soon())["weight"][1] == torch.float64


def test_handles_are_stale_after_reset(worker):
    model = worker.call("build_model", ({"d": 2},), deadline=soon())
    assert worker.ping(deadline=soon())["handles"] >= 1
    worker.reset(deadline=soon())
    assert worker.ping(deadline=soon())["handles"] == 0
    with pytest.raises(StaleHandleError, match="reset"):
        worker.call("count_parameters", (model,), deadline=soon())


def test_unsendable_arguments_are_refused_before_sending(worker):
    with pytest.raises(wire.WireError, match="cannot be sent"):
        worker.call("softmax", (object(),), deadline=soon())
    assert worker.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]


def test_a_request_the_worker_cannot_decode_is_an_error_not_a_crash(worker):
    g = torch.Generator().manual_seed(0)
    before = g.get_state()
    generation = worker.generation
    with pytest.raises(RemoteError, match="does not provide rope"):
        worker.call("rope", (torch.zeros(2),), {"generator": g}, deadline=soon())
    forged = RemoteHandle(9999, "module", "x.Model", worker.generation, worker.epoch, id(worker))
    with pytest.raises(RemoteError, match="handle 9999 .* is not held by this worker"):
        worker.call("count_parameters", (forged,), {"generator": g}, deadline=soon())
    assert torch.equal(g.get_state(), before) and worker.generation == generation


def test_unknown_names_are_errors(worker):
    with pytest.raises(RemoteError, match="not a protocol v1 name"):
        worker.call("os_system", (), deadline=soon())
    with pytest.raises(RemoteError, match="does not provide rope"):
        worker.call("rope", (1, 2), deadline=soon())
    with pytest.raises(RemoteError, match="no model operation"):
        worker.op("nonexistent", (), deadline=soon())


def test_timeout_kills_the_worker_within_the_deadline_and_the_next_call_restarts(worker):
    model = worker.call("build_model", ({"d": 2},), deadline=soon())
    generation = worker.generation
    start = time.monotonic()
    with pytest.raises(WorkerTimeout, match="call silu"):
        worker.call("silu", (torch.zeros(1),), deadline=start + 1.5)
    took = time.monotonic() - start
    assert 1.4 <= took < 2.5, took
    assert not worker.alive
    assert worker.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]
    assert worker.generation == generation + 1
    with pytest.raises(StaleHandleError, match=f"generation {generation}; the worker has since been restarted"):
        worker.call("count_parameters", (model,), deadline=soon())


def test_restarting_is_not_charged_to_the_deadline(worker):
    with pytest.raises(WorkerCrashed):
        worker.call("rmsnorm", (1, 2), deadline=soon())
    started = time.monotonic()
    out = worker.call("softmax", (torch.zeros(2),), deadline=started + 0.3)  # a restart takes longer than that
    assert out.tolist() == [0.5, 0.5] and time.monotonic() - started > 0.3


def test_a_tests_limit_does_not_count_the_workers_restart(worker, monkeypatch):
    """A restart after a crash (the previous test's, or this one's) moves the test's deadline on by the time it took,
    so that the test's later calls (and the probes of its crash) keep their whole limit on a slow machine."""
    from spec_tests.harness.remote.remote_subject import RemoteSubject

    subject = RemoteSubject(worker, test_timeout=2.0)
    subject.begin_test()
    with pytest.raises(ImplementationError, match="segmentation fault"):
        subject.rmsnorm(1, 2)
    real_start = worker._start

    def slow_start():
        time.sleep(2.5)  # longer than the test's whole limit
        return real_start()

    monkeypatch.setattr(worker, "_start", slow_start)
    assert subject.softmax(torch.zeros(2)).tolist() == [0.5, 0.5]
    assert subject.deadline - time.monotonic() > 1.0  # without the restart's 2.5 s it would have passed
    assert subject.softmax(torch.zeros(2)).tolist() == [0.5, 0.5]


def test_explaining_a_failure_has_its_own_limit(worker):
    """Probes and diagnoses run under ``diagnosing()``: the whole limit afresh, however much the test used; the test's
    own limit goes on afterwards where it was."""
    from spec_tests.harness.remote.remote_subject import RemoteSubject

    subject = RemoteSubject(worker, test_timeout=1.0)
    subject.begin_test()
    time.sleep(0.8)
    with subject.diagnosing():
        time.sleep(0.5)  # past the test's own limit
        assert subject.softmax(torch.zeros(2)).tolist() == [0.5, 0.5]
    assert 0.05 < subject.deadline - time.monotonic() < 0.25  # the 0.2 s the test had left


@pytest.mark.parametrize(
    "name, args, signal_name, reason",
    [
        ("rmsnorm", (1, 2), "SIGSEGV", "crashed with a segmentation fault (SIGSEGV)"),
        ("flash_attention", (1, 2, 3), "SIGKILL", "was killed (SIGKILL), usually for using too much memory"),
        ("repeat_kv", (1, 2), None, "ended with exit status 7"),
    ],
)
def test_crashes_are_reported_and_followed_by_a_fresh_worker(worker, name, args, signal_name, reason):
    generation = worker.generation
    worker.call("causal_mask", (2, 2), deadline=soon())  # something in the log
    with pytest.raises(WorkerCrashed) as info:
        worker.call(name, args, deadline=soon())
    assert reason in str(info.value) and info.value.signal_name == signal_name
    assert info.value.exit_status == (7 if signal_name is None else None)
    assert "hello from causal_mask" in info.value.log_tail
    assert worker.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]
    assert worker.generation == generation + 1


def test_generators_follow_the_same_stream_as_in_process(worker):
    logits = torch.randn(4, 10)
    remote_g = torch.Generator().manual_seed(7)
    local_g = torch.Generator().manual_seed(7)
    for _ in range(3):  # one generator reused across calls
        got = worker.call("sample", (logits,), {"generator": remote_g}, deadline=soon())
        want = torch.multinomial(torch.softmax(logits, -1), 1, generator=local_g).squeeze(-1)
        assert torch.equal(got, want)
    assert torch.equal(remote_g.get_state(), local_g.get_state())
    data = torch.arange(100)
    x, y = worker.call("get_batch", (data, 4, 8), {"generator": remote_g}, deadline=soon())
    starts = torch.randint(0, 92, (4,), generator=local_g)
    assert torch.equal(x[:, 0], starts) and torch.equal(y[:, 0], starts + 1)
    assert torch.equal(remote_g.get_state(), local_g.get_state())
    # the generator state also comes back when the call fails
    with pytest.raises(RemoteError, match="random_ expects"):
        worker.call("get_batch", (torch.arange(3), 4, 8), {"generator": remote_g}, deadline=soon())
    assert torch.equal(remote_g.get_state(), local_g.get_state())


def test_a_composite_call_returns_the_implementations_own_value(worker):
    logits = torch.randn(3, 5, dtype=torch.float64)
    targets = torch.tensor([0, 4, 2])
    own = worker.call("cross_entropy", (logits, targets), deadline=soon())
    assert torch.allclose(own, torch.nn.functional.cross_entropy(logits, targets))
    assert torch.equal(worker.call("cross_entropy", (logits, targets), deadline=soon()), own)


def test_a_composite_keeps_the_generator_in_step(worker):
    """generate -> sample: the judge's generator goes to the worker, through the composite, back."""
    prompt = torch.randn(2, 6)
    local = torch.Generator().manual_seed(3)
    expected = torch.stack(
        [torch.multinomial(torch.softmax(prompt, -1), 1, generator=local).squeeze(-1) for _ in range(4)], -1
    )
    g = torch.Generator().manual_seed(3)
    out = worker.call("generate", (None, prompt, 4), {"generator": g}, deadline=soon())
    assert torch.equal(out, expected) and torch.equal(g.get_state(), local.get_state())


def test_printing_does_not_disturb_the_channel(worker):
    out = worker.call("causal_mask", (2, 3), deadline=soon())
    assert torch.equal(out, torch.ones(2, 3, dtype=torch.bool).tril(1))
    worker.ping(deadline=soon())
    text = worker.log_text()
    assert "hello from causal_mask" in text and "to stderr" in text and "raw bytes on fd 1" in text
    assert "\x00" not in text


def test_the_log_is_capped(tmp_path):
    from spec_tests.harness.remote.client import CappedLog

    log = CappedLog(str(tmp_path / "log"), cap=4096)
    for i in range(1000):
        log.feed(f"line {i}\n".encode())
    text = log.text()
    assert text.startswith("line 0\n") and text.endswith("line 999\n") and "bytes of output dropped" in text
    assert len(text) < 4096 + 100
    log.close()
    assert (tmp_path / "log").stat().st_size < 4096 + 100


def test_import_failures_are_reported_with_where(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise ValueError('no model today')\n")
    with Worker(broken, start_timeout=60) as w:
        with pytest.raises(RemoteImportError) as info:
            w.start()
        started = time.monotonic()
        with pytest.raises(RemoteImportError):  # remembered, not retried
            w.call("softmax", (torch.zeros(2),))
        assert time.monotonic() - started < 0.5
    err = info.value
    assert err.type == "ValueError" and err.where == "broken.py:2 in <module>"
    assert "failed to import" in err.message and "no model today" in err.message
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def f(:\n")
    with Worker(syntax, start_timeout=60) as w, pytest.raises(RemoteImportError) as info:
        w.start()
    assert info.value.type == "SyntaxError" and info.value.where == "syntax.py:1"
