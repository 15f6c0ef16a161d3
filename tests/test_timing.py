"""Timing statistics, call accounting, peak memory and the per-stage clock."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from sdperf.timing import StageClock, Timing, measure, peak_memory, ratio, reset_peak_memory


def test_statistics_match_numpy():
    times = [0.5, 0.1, 0.4, 0.2, 0.3, 0.9]
    t = Timing(times=times, first_call=2.0)
    assert t.median == pytest.approx(np.median(times))
    assert t.p10 == pytest.approx(np.percentile(times, 10)) and t.p90 == pytest.approx(np.percentile(times, 90))
    assert t.p10 <= t.median <= t.p90


def test_measure_times_first_call_apart_and_counts_calls():
    calls = []

    def fn():
        time.sleep(0.2 if not calls else 0.02)  # a slow first call, like a compile
        calls.append(1)

    t = measure(fn, device="cpu", warmup=3, repeats=4)
    assert len(calls) == 1 + 2 + 4  # first, warmup-1 untimed, repeats timed
    assert len(t.times) == 4
    assert t.first_call >= 0.2
    assert 0.02 <= t.median < 0.15


def test_measure_keeps_the_thread_count():
    before = torch.get_num_threads()
    measure(lambda: None, device="cpu", warmup=1, repeats=2)
    assert torch.get_num_threads() == before


def test_measure_rejects_zero_repeats():
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, device="cpu", repeats=0)


def test_peak_memory_sees_a_large_allocation():
    def allocate():
        x = torch.ones(64, 2**20)  # 256 MiB, touched
        return float(x.sum())

    reset_peak_memory("cpu")
    idle, kind = peak_memory("cpu")
    t = measure(allocate, device="cpu", warmup=1, repeats=1)
    assert "RSS" in kind and t.memory_kind == kind
    assert t.peak_memory_bytes - idle > 200 * 2**20


def test_ratio_is_baseline_over_variant_with_conservative_range():
    base = Timing([2.0, 2.2, 1.8], 3.0)
    fast = Timing([1.0, 1.1, 0.9], 1.5)
    r = ratio(base, fast)
    assert r["speedup"] == pytest.approx(2.0)
    assert r["speedup_lo"] < r["speedup"] < r["speedup_hi"]


def test_stage_clock_records_each_stage():
    clock = StageClock("cpu")
    for _ in range(3):
        with clock("unet"):
            time.sleep(0.01)
    with clock("vae_decode"):
        pass
    rec = clock.collect()
    assert len(rec["unet"]) == 3 and all(t >= 0.01 for t in rec["unet"])
    assert len(rec["vae_decode"]) == 1
