"""Timing statistics, call accounting, peak memory and the per-stage clock."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from sdperf.measure.timing import (StageClock, Timing, interleaved, measure, peak_memory, peak_of, ratio,
                           reset_peak_memory)


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


def test_interleaved_times_every_call_each_round_after_their_first_calls():
    calls = []
    out = interleaved({"slow": lambda: (calls.append("slow"), time.sleep(0.02)),
                       "fast": lambda: calls.append("fast")}, device="cpu", warmup=2, repeats=3)
    # first calls, one untimed warm-up round, then three rounds in turn, every other one reversed
    assert calls == ["slow", "fast"] * 3 + ["fast", "slow"] + ["slow", "fast"]
    assert len(out["slow"].times) == 3 and out["slow"].median > out["fast"].median


def test_interleaved_shares_a_drift_between_the_calls():
    """A machine that speeds up as it goes: timed one after the other, the later call looks faster than it is;
    timed in turn, two identical calls come out equal (to the drift between neighbours: ABBA of a 15% per-call drift
    gives 0.85 at best). The calls sleep long enough (64-200 ms) that a loaded machine's wake-up jitter of a few ms
    cannot push that ratio past the bounds: at 20 ms a 2-core CI run under load once read 0.726."""
    speed = [1.0]

    def work():
        time.sleep(0.2 * speed[0])
        speed[0] *= 0.85

    a = measure(work, device="cpu", warmup=1, repeats=3)
    b = measure(work, device="cpu", warmup=1, repeats=3)
    assert ratio(a, b)["speedup"] > 1.5  # the drift, read as a speed-up
    speed[0] = 1.0
    out = interleaved({"a": work, "b": work}, device="cpu", warmup=1, repeats=3)
    assert 0.75 < ratio(out["a"], out["b"])["speedup"] < 1.35


def test_interleaved_rejects_zero_repeats():
    with pytest.raises(ValueError, match="repeats"):
        interleaved({"a": lambda: None}, device="cpu", repeats=0)


def test_peak_of_reads_one_call_alone():
    def allocate():
        x = torch.ones(64, 2**20)  # 256 MiB, touched
        return float(x.sum())

    reset_peak_memory("cpu")
    idle, _ = peak_memory("cpu")
    peak, kind = peak_of(allocate, "cpu")
    assert "RSS" in kind and peak - idle > 200 * 2**20


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
