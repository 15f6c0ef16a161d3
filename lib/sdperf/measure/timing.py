"""How every number in the study is timed: warm-up apart, repeats, median with p10/p90, peak memory.

CUDA events on a GPU, a monotonic clock on the CPU; torch.utils.benchmark only for short kernels (`blocked`): its
hidden warm-up calls would blur what "first call" means.
"""
from __future__ import annotations

import contextlib
import ctypes
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.utils.benchmark as benchmark

from sdperf.measure import contention


@dataclass
class Timing:
    times: list[float]
    first_call: float
    peak_memory_bytes: int | None = None
    memory_kind: str = ""
    contention: dict | None = None  # what other processes took of the CPUs over the timed calls

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def p10(self) -> float:
        return float(np.percentile(self.times, 10))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.times, 90))

    def summary(self) -> dict:
        return {"median_s": self.median, "p10_s": self.p10, "p90_s": self.p90, "n": len(self.times),
                "first_call_s": self.first_call,
                "peak_memory_mib": None if self.peak_memory_bytes is None else self.peak_memory_bytes / 2**20}


def ratio(baseline: Timing, variant: Timing) -> dict:
    """Speed-up baseline/variant: ratio of medians, with a conservative range from the p10/p90 of each."""
    return {"speedup": baseline.median / variant.median, "speedup_lo": baseline.p10 / variant.p90,
            "speedup_hi": baseline.p90 / variant.p10}


# --- peak memory -------------------------------------------------------------------------------------------
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _read_hwm() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError, AttributeError):  # hand freed heap back first, or RSS counts it
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with contextlib.suppress(OSError):  # Linux: writing 5 resets the peak RSS (VmHWM) of this process
        _CLEAR_REFS.write_text("5")


def peak_memory(device: str) -> tuple[int | None, str]:
    """(bytes, what was measured): CUDA max allocated, or the process's peak RSS since the last reset."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated(), "CUDA max_memory_allocated"
    hwm = _read_hwm()
    if hwm is not None:
        return hwm, "process peak RSS (VmHWM, reset before the measurement)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS since start (ru_maxrss)"


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --- timers ----------------------------------------------------------------------------------------------
def _time_once_cpu(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _time_once_cuda(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def time_once(fn: Callable[[], object], device: str) -> float:
    return (_time_once_cuda if device == "cuda" else _time_once_cpu)(fn)


def interleaved(calls: dict[str, Callable[[], object]], *, device: str, warmup: int = 1,
                repeats: int = 3) -> dict[str, Timing]:
    """Like measure, each call in turn (A B, B A, ...) so a process's drift hits all alike; no peak (`peak_of`)."""
    _check_counts(warmup, repeats)
    synchronize(device)
    first = {k: time_once(fn, device) for k, fn in calls.items()}
    for _ in range(max(warmup - 1, 0)):
        for fn in calls.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(repeats):
        for k in (list(calls) if r % 2 == 0 else list(reversed(calls))):  # ABBA: no call is always the later one
            times[k].append(time_once(calls[k], device))
    return {k: Timing(times=times[k], first_call=first[k]) for k in calls}


def peak_of(fn: Callable[[], object], device: str) -> tuple[int | None, str]:
    """(bytes, what was measured) at the peak of one more, untimed, call: a warm call's memory on its own."""
    reset_peak_memory(device)
    fn()
    synchronize(device)
    return peak_memory(device)


def _check_counts(warmup: int, repeats: int) -> None:
    """warmup counts the first call, which always runs: 0 would run as 1 and be recorded as 0."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (it counts the first call, which always runs), got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")


def measure(fn: Callable[[], object], *, device: str, warmup: int = 1, repeats: int = 3,
            first: Callable[[], object] | None = None) -> Timing:
    """First call (or `first`) timed alone, `warmup - 1` untimed calls, then `repeats` timed ones with their peak."""
    _check_counts(warmup, repeats)
    once = _time_once_cuda if device == "cuda" else _time_once_cpu
    synchronize(device)
    first_s = once(first or fn)
    for _ in range(max(warmup - 1, 0)):
        fn()
    reset_peak_memory(device)
    before = contention.sample()
    times = [once(fn) for _ in range(repeats)]
    taken = contention.between(before, contention.sample())
    peak, kind = peak_memory(device)
    return Timing(times=times, first_call=first_s, peak_memory_bytes=peak, memory_kind=kind, contention=taken)


def blocked(fn: Callable[[], object], *, device: str, min_run_time: float = 1.0) -> Timing:
    """For short kernels (matmul roof): blocked_autorange, one entry per block, at the process's thread count."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - t0
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(times=list(m.times), first_call=first)


# --- per-stage clock ---------------------------------------------------------------------------------------
@dataclass
class StageClock:
    """The time of each stage call inside one generation; on CUDA events, read once at the end (no added sync)."""

    device: str
    _open: list = field(default_factory=list)
    records: dict[str, list[float]] = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, stage: str):
        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._open.append((stage, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.records.setdefault(stage, []).append(time.perf_counter() - t0)

    def collect(self) -> dict[str, list[float]]:
        if self._open:
            torch.cuda.synchronize()
            for stage, start, end in self._open:
                self.records.setdefault(stage, []).append(start.elapsed_time(end) / 1000.0)
            self._open.clear()
        return self.records
