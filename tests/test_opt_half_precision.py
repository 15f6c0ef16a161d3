"""The half-precision budget rule (sdperf.measure.half_budget): a half precision whose generations would overrun the budget
is recorded as skipped, with the block-level ratio that predicted it, instead of being run; the block is timed
once per run, whichever of 01, 10 and 12 asks first."""
from __future__ import annotations

import pytest

from sdperf.measure import half_budget, measurements
from sdperf.experiments import half_precision as ex
from sdperf.store.results import read_results
from sdperf.measure.study import open_study


def _probe(speedup: float, fp32_s: float = 0.5) -> half_budget.Probe:
    return half_budget.Probe("float16", "down_blocks.0", speedup, speedup * 0.9, speedup * 1.1, 1e-3, fp32_s,
                             [0.01, 0.011], [0.3, 0.31])


def test_the_budget_counts_the_generations_asked_for():
    assert _probe(0.1).skip_reason(4, 5.0, "4 generations")  # 0.5 s / 0.1 x 4 = 20 s
    assert _probe(1.0).skip_reason(4, 5.0, "4 generations") is None  # 2 s
    assert _probe(1.0).skip_reason(4, 5.0, "4 images", fp32_generation_s=2.0)  # 8 s from the caller's own scale
    why = _probe(0.033).skip_reason(4, 5.0, "4 generations")
    assert "30.30x the float32 time" in why and "about 61 s" in why and "variant_budget_s=5 s" in why


def test_an_over_budget_precision_is_recorded_as_skipped_with_its_block_ratio(scratch_reports):
    study = open_study("smoke", notebook="01_test")
    probe = _probe(0.033)
    row = ex._block_only(study, probe, probe.skip_reason(4, 5.0, "4 generations"))
    assert row["status"] == ex.BLOCK_ONLY and row["key"] == "precision:float16" and row["speedup"] == 0.033
    stored = read_results("smoke").set_index(["scenario", "metric"])
    skip = stored.loc[("float16 weights+activations, batch 1", "latency")]
    assert skip.status == "skipped" and "30.30x" in skip.note and "variant_budget_s=5" in skip.note
    ratio = stored.loc[("float16, UNet down_blocks.0 only (real shapes), batch 1", "speedup_vs_fp32")]
    assert ratio.value == 0.033 and ratio.lo == pytest.approx(0.0297) and ratio.hi == pytest.approx(0.0363)


def test_the_block_is_timed_once_per_run_and_read_back_by_the_next_notebook(scratch_reports, monkeypatch):
    calls = {"block": 0, "generation": 0}
    block, generation = measurements.block_comparison, measurements.timed_generation

    def counted_block(*a, **kw):
        calls["block"] += 1
        return block(*a, **kw)

    def counted_generation(*a, **kw):
        calls["generation"] += 1
        return generation(*a, **kw)

    monkeypatch.setattr(measurements, "block_comparison", counted_block)
    monkeypatch.setattr(measurements, "timed_generation", counted_generation)
    monkeypatch.setenv("SDPERF_RUN_ID", "run-a")
    first = half_budget.probe(open_study("smoke", notebook="01_test"), "bfloat16")
    again = half_budget.probe(open_study("smoke", notebook="10_test"), "bfloat16")
    assert again == first and calls == {"block": 1, "generation": 1}
    other = half_budget.probe(open_study("smoke", notebook="12_test"), "float16")
    assert other.dtype == "float16" and other.fp32_generation_s == first.fp32_generation_s
    assert calls == {"block": 2, "generation": 1}  # the fp32 generation is the run's too
    monkeypatch.setenv("SDPERF_RUN_ID", "run-b")  # another run measures again
    half_budget.probe(open_study("smoke", notebook="01_test"), "bfloat16")
    assert calls == {"block": 3, "generation": 2}
