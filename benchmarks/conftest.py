"""pytest-benchmark setup for ``pytest benchmarks --impl=NAME --device cpu|cuda``.

Two modes:

- **smoke** (plain ``pytest benchmarks``): pytest-benchmark is disabled, every benchmark body
  runs once at tiny sizes, as a quick check that each measured code path works;
- **measure** (``--benchmark-only``, ``--benchmark-enable``, ``--benchmark-json``,
  ``--benchmark-save`` or ``--benchmark-autosave``): full sizes, warm-up calls, a synchronising
  timer, and the GPU, torch and CUDA versions added to the saved machine info.

``--bench-sizes smoke|full`` overrides the sizes either way; ``--bench-threads N`` sets torch's
CPU threads (default: the suite's, ``$SPEC_TORCH_THREADS`` or 1); ``--bench-contenders
impl,reference,hf`` picks who runs side by side.

Clock: single-threaded CPU runs are timed in process CPU time (``time.process_time``), which a
loaded shared machine does not inflate the way it inflates wall time; multi-threaded CPU runs
and CUDA runs in wall time (``time.perf_counter``, after a device synchronisation). An explicit
``--benchmark-timer`` wins. The clock used is saved in the machine info.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the suite's plugin and the reference, uninstalled
    sys.path.insert(0, str(ROOT))

from benchmarks import configs, contenders, hf_llama, timing  # noqa: E402

pytest_plugins = ["spec_tests.harness.plugin.hooks"]  # the --spec-* options

MEASURE_OPTIONS = ("benchmark_only", "benchmark_enable", "benchmark_json", "benchmark_save", "benchmark_autosave")


def pytest_addoption(parser):
    from spec_tests.harness.plugin.hooks import add_short_impl_option

    add_short_impl_option(parser)
    group = parser.getgroup("bench", "transformer spec benchmarks")
    group.addoption("--device", choices=("cpu", "cuda"), default=None, help="device (default: --spec-device, cpu)")
    group.addoption(
        "--bench-sizes",
        choices=("smoke", "full"),
        default=None,
        help="sizes to run at (default: smoke when benchmarks are disabled, full when measuring)",
    )
    group.addoption("--bench-threads", type=int, default=None, help="torch.set_num_threads for CPU runs")
    group.addoption(
        "--bench-contenders",
        default=",".join(contenders.CONTENDERS),
        help="comma-separated subset of impl,reference,hf to run side by side",
    )


DEFAULT_TIMER = "time.perf_counter"  # pytest-benchmark's default --benchmark-timer


def measuring(config) -> bool:
    return any(config.getoption(name, None) for name in MEASURE_OPTIONS)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Without a measuring option, run each benchmark once (pytest-benchmark's disabled mode);
    this runs before pytest-benchmark reads its options."""
    if not hasattr(config.option, "benchmark_disable"):
        raise pytest.UsageError("the benchmarks need pytest-benchmark: pip install pytest-benchmark")
    if not measuring(config):
        config.option.benchmark_disable = True
    # a test that fails before timing (e.g. "not implemented") needs no second complaint
    config.addinivalue_line("filterwarnings", "ignore:Benchmark fixture was not used at all")
    config._bench_profile = config.getoption("bench_sizes") or ("full" if measuring(config) else "smoke")
    # the suite's plugin sets torch's threads in its own pytest_configure; ours are applied after it
    config._bench_threads = config.getoption("bench_threads") or int(os.environ.get("SPEC_TORCH_THREADS", "1"))
    torch.set_num_threads(config._bench_threads)
    if config.getoption("benchmark_timer") == DEFAULT_TIMER:
        config.option.benchmark_timer = f"time.{timing.clock_name(bench_device(config))}"
    unknown = set(config.getoption("bench_contenders").split(",")) - set(contenders.CONTENDERS)
    if unknown:
        raise pytest.UsageError(f"--bench-contenders: unknown {sorted(unknown)}; known: {contenders.CONTENDERS}")


def bench_device(config) -> str:
    return config.getoption("device") or config.getoption("spec_device")


@pytest.fixture(scope="session")
def device(request) -> str:
    return bench_device(request.config)


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (``--impl``), as the suite's Subject."""
    from spec_tests.harness.plugin.hooks import session_of

    return session_of(request.config).impl


def bench_sizes(config) -> configs.DeviceSizes:
    return configs.sizes_for(bench_device(config), config._bench_profile)


def pytest_report_header(config):
    sizes = bench_sizes(config)
    mode = "measure" if measuring(config) else "smoke (each benchmark runs once; --benchmark-only measures)"
    return (
        f"benchmarks: mode={mode} sizes={config._bench_profile} dtype={sizes.dtype} threads={torch.get_num_threads()}"
    )


@pytest.hookimpl(trylast=True)  # after the @parametrize marks, so that the parameters below vary fastest
def pytest_generate_tests(metafunc):
    """Parametrise over the sizes of this run (they depend on --device and the mode).

    Contenders (and attention kernels) vary fastest, so the runs being compared are measured
    one after the other, under the same load.
    """
    sizes = bench_sizes(metafunc.config)
    if "heads" in metafunc.fixturenames:
        metafunc.parametrize("heads", list(sizes.attention_heads))
    if "attention_length" in metafunc.fixturenames:
        metafunc.parametrize("attention_length", sizes.attention_lengths, ids=lambda t: f"T{t}")
    if "kernel" in metafunc.fixturenames:
        metafunc.parametrize("kernel", ATTENTION_KERNELS)
    if "decode_context" in metafunc.fixturenames:
        metafunc.parametrize("decode_context", sizes.decode_contexts, ids=lambda c: f"ctx{c}")
    if "contender_name" in metafunc.fixturenames:
        names = [n for n in contenders.CONTENDERS if n in metafunc.config.getoption("bench_contenders").split(",")]
        metafunc.parametrize("contender_name", names)


ATTENTION_KERNELS = ("naive", "flash", "sdpa")


def pytest_benchmark_update_machine_info(config, machine_info):
    """GPU name, torch/CUDA versions, threads and the run's sizes, saved with every result file."""
    device = bench_device(config)
    sizes = bench_sizes(config)
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "threads": torch.get_num_threads(),
        "clock": config.getoption("benchmark_timer"),
        "device": device,
        "dtype": str(sizes.dtype).removeprefix("torch."),
        "sizes": config._bench_profile,
        "model_config": sizes.model,
        "impl": config.getoption("impl") or config.getoption("spec_impl") or "reference",
        "transformers": hf_llama.version() if hf_llama.available() else None,
        "python": platform.python_version(),
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_count=torch.cuda.device_count(),
            peak_bf16_flops=configs.peak_bf16_flops(torch.cuda.get_device_name(0)),
        )
    machine_info["transformer_bench"] = info


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session", autouse=True)
def _torch_threads(request):
    """The suite's plugin sets torch's threads in its pytest_configure, after ours: set them again."""
    torch.set_num_threads(request.config._bench_threads)


@pytest.fixture(scope="session")
def sizes(request) -> configs.DeviceSizes:
    return bench_sizes(request.config)


@pytest.fixture(scope="session")
def _contender_cache():
    return {}


@pytest.fixture
def make_contender(impl, device, sizes, _contender_cache):
    """``make_contender(name, config=sizes.model)``: a contender at ``config``, built once per session.

    Skips the reference when it is the implementation under test, and Hugging Face where it
    cannot run (not installed, a family it does not cover).
    """

    def make(name: str, config: dict | None = None) -> contenders.Contender:
        config = sizes.model if config is None else config
        if name == "reference" and contenders.is_reference(impl):
            pytest.skip("the implementation under test is the reference")
        key = (name, tuple(sorted(config.items())))
        if key not in _contender_cache:
            weights = contenders.canonical_weights(config)
            try:
                _contender_cache[key] = contenders.build_contender(name, impl, config, weights, device, sizes.dtype)
            except LookupError as exc:
                pytest.skip(str(exc))
        return _contender_cache[key]

    return make


class Measure:
    """pytest-benchmark driven the same way on CPU and CUDA.

    The timed function synchronises the device before returning, warm-up calls run first (not
    in smoke mode), and the number of rounds follows ``--benchmark-max-time`` and
    ``--benchmark-min-rounds``. ``setup`` runs untimed before every round and returns the
    call's positional arguments.
    """

    def __init__(self, benchmark, device: str, config):
        self.benchmark, self.device = benchmark, device
        self.max_time = float(config.getoption("benchmark_max_time"))
        self.min_rounds = int(config.getoption("benchmark_min_rounds"))

    @property
    def smoke(self) -> bool:
        return self.benchmark.disabled

    def __call__(self, fn, *, group: str, setup=None, warmup: int = 2, min_rounds: int | None = None, **extra):
        benchmark = self.benchmark
        benchmark.group = group
        benchmark.extra_info.update(extra)
        run = timing.synchronized(fn, self.device)
        pedantic_setup = (lambda: (setup(), {})) if setup else None
        if self.smoke:
            return benchmark.pedantic(run, setup=pedantic_setup, rounds=1)
        seconds = timing.median_seconds(fn, self.device, setup=setup, warmup=warmup, repeats=1)
        floor = self.min_rounds if min_rounds is None else min(min_rounds, self.min_rounds)
        rounds = max(floor, min(200, math.ceil(self.max_time / max(seconds, 1e-6))))
        result = benchmark.pedantic(run, setup=pedantic_setup, rounds=rounds, iterations=1)
        benchmark.extra_info["median_s"] = benchmark.stats.stats.median
        return result


@pytest.fixture
def measure(benchmark, device, request) -> Measure:
    return Measure(benchmark, device, request.config)


@pytest.fixture
def token_ids(sizes, device):
    """``token_ids(batch, length)``: seeded random ids on the run's device."""

    def make(batch: int, length: int, vocab: int | None = None, seed: int = 0) -> torch.Tensor:
        vocab = vocab or sizes.model["vocab_size"]
        ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
        return ids.to(device)

    return make
