"""01's budget rule: a half precision whose generations would overrun the budget is recorded as skipped, with the
block-level ratio that predicted it, instead of being run."""
from __future__ import annotations

from sdperf.experiments import half_precision as ex
from sdperf.results import read_results
from sdperf.study import open_study
from sdperf.timing import Timing


def test_the_budget_counts_the_generations_of_one_process():
    assert ex.over_budget(0.5, 0.1, 4, 5.0)  # 0.5 s / 0.1 x 4 = 20 s
    assert not ex.over_budget(0.5, 1.0, 4, 5.0)  # 2 s


def test_an_over_budget_precision_is_recorded_as_skipped_with_its_block_ratio(scratch_reports):
    study = open_study("smoke", notebook="01_test")
    block = {"block": "down_blocks.0", "baseline_timing": Timing(times=[0.01, 0.011], first_call=0.02),
             "variant_timing": Timing(times=[0.3, 0.31], first_call=0.4), "speedup": 0.033, "speedup_lo": 0.03,
             "speedup_hi": 0.036, "block_rel_error": 1e-3}
    row = ex._block_only(study, "float16", block, 4)
    assert row["status"] == ex.BLOCK_ONLY and row["key"] == "precision:float16" and row["speedup"] == 0.033
    stored = read_results("smoke").set_index(["scenario", "metric"])
    skip = stored.loc[("float16 weights+activations, batch 1", "latency")]
    assert skip.status == "skipped" and "0.033x" in skip.note and "variant_budget_s=5" in skip.note
    ratio = stored.loc[("float16, UNet down_blocks.0 only (real shapes), batch 1", "speedup_vs_fp32")]
    assert (ratio.value, ratio.lo, ratio.hi) == (0.033, 0.03, 0.036)
