"""Timing and memory measurement that is correct on CUDA: synchronise, warm up, take medians.

CUDA kernels run asynchronously, so a timer that does not call ``torch.cuda.synchronize()``
measures only the launch. Every timed function here synchronises before the clock stops.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def clock_name(device: str | torch.device) -> str:
    """``process_time`` (CPU seconds of this process) for single-threaded CPU runs, else ``perf_counter``.

    On a shared machine wall time includes waiting for a core, which is not the code's cost;
    with one torch thread the process's CPU time is the work done, and stays comparable under
    load. With several threads CPU time would add the threads up, so wall time is used; on CUDA
    the GPU's work is only visible in wall time (after a synchronisation).
    """
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return "process_time"
    return "perf_counter"


def clock(device: str | torch.device) -> Callable[[], float]:
    return getattr(time, clock_name(device))


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def synchronized(fn: Callable, device: str | torch.device) -> Callable:
    """``fn`` followed by a device synchronisation, so a host timer sees the whole computation."""

    def run(*args, **kwargs):
        result = fn(*args, **kwargs)
        synchronize(device)
        return result

    return run


def median_seconds(
    fn: Callable[[], object],
    device: str | torch.device,
    *,
    setup: Callable[[], tuple] | None = None,
    warmup: int = 2,
    repeats: int = 5,
    max_seconds: float = 2.0,
) -> float:
    """Median time (``clock(device)``) of ``fn(*setup())`` over ``repeats`` timed calls after ``warmup`` untimed ones.

    ``setup`` (untimed) runs before every call and returns the call's arguments. Stops early once
    ``max_seconds`` of timed calls have accumulated (at least one timed call always runs).
    """
    run, now = synchronized(fn, device), clock(device)
    for _ in range(warmup):
        run(*(setup() if setup else ()))
    times: list[float] = []
    while len(times) < max(1, repeats):
        args = setup() if setup else ()
        synchronize(device)
        start = now()
        run(*args)
        times.append(now() - start)
        if sum(times) > max_seconds:
            break
    return statistics.median(times)


_PROC_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _resident_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", _PROC_STATUS.read_text()).group(1))


def cpu_peak_tracking_available() -> bool:
    """Linux lets a process reset its peak resident size by writing 5 to ``/proc/self/clear_refs``."""
    try:
        _CLEAR_REFS.write_text("5")
        _resident_kib("VmHWM")
        return True
    except (OSError, AttributeError):
        return False


def peak_memory_bytes(fn: Callable[[], object], device: str | torch.device) -> int | None:
    """Extra memory at the peak of ``fn()`` over what was in use before it.

    CUDA: ``torch.cuda.max_memory_allocated`` (the caching allocator's exact count).
    CPU: growth of the process's peak resident set (``VmHWM`` after resetting it), an
    approximation that includes allocator slack; None where the kernel does not allow the reset.
    """
    if torch.device(device).type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if not cpu_peak_tracking_available():
        return None
    _CLEAR_REFS.write_text("5")
    before = _resident_kib("VmRSS")
    fn()
    return max(0, _resident_kib("VmHWM") - before) * 1024


def interleaved_times(
    fns: dict[str, Callable],
    device: str | torch.device,
    *,
    setups: dict[str, Callable[[], tuple]] | None = None,
    rounds: int = 5,
    warmup: int = 1,
    max_seconds: float = 60.0,
) -> dict[str, list[float]]:
    """Times (``clock(device)``) of each function over ``rounds``, the functions taken in turn
    within every round, so that load on a shared machine falls on all of them alike.

    ``setups[name]`` (untimed) returns the arguments of each call of ``fns[name]``. Stops after
    the round in which ``max_seconds`` of wall time have passed.
    """
    setups, now = setups or {}, clock(device)
    run = {name: synchronized(fn, device) for name, fn in fns.items()}
    for _ in range(warmup):
        for name in fns:
            run[name](*(setups[name]() if name in setups else ()))
    times: dict[str, list[float]] = {name: [] for name in fns}
    began = time.perf_counter()
    for _ in range(max(1, rounds)):
        for name in fns:
            args = setups[name]() if name in setups else ()
            synchronize(device)
            start = now()
            run[name](*args)
            times[name].append(now() - start)
        if time.perf_counter() - began > max_seconds:
            break
    return times
