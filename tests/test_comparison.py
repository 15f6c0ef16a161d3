"""The shared variant runner: what every optimization notebook stores for a variant, and for one that cannot run."""
from __future__ import annotations

import math

import pytest

from sdperf.comparison import BASELINE, COLUMNS, Variant, run_variants
from sdperf.study import open_study


def _boom(pipe):
    raise RuntimeError("planted failure")


def _scaled_eps(pipe):
    """A variant that changes the output on purpose: the UNet's noise estimate scaled by 1.1."""
    forward = pipe.unet.forward

    def scaled(*args, **kwargs):
        out = forward(*args, **kwargs)
        return (out[0] * 1.1,) + tuple(out[1:])

    pipe.unet.forward = scaled
    return pipe


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDPERF_REPORTS_DIR", str(tmp_path_factory.mktemp("reports")))
        study = open_study("smoke", notebook="zz_comparison")
        variants = [Variant("same network", note="identity"), Variant("scaled eps", apply=_scaled_eps),
                    Variant("needs a GPU", availability=(False, "no CUDA device here")),
                    Variant("raises", apply=_boom)]
        comp = run_variants(study, variants, say=lambda _msg: None)
        yield comp, study.recorder.table()


def test_table_has_one_row_per_variant_with_the_baseline_first_and_last(comparison):
    comp, _ = comparison
    t = comp.table
    assert list(t.columns) == COLUMNS
    assert t["variant"].tolist() == [BASELINE, "same network", "scaled eps", "needs a GPU", "raises",
                                     f"{BASELINE} (re-timed after the variants)"]
    assert t["status"].tolist() == ["ok", "ok", "ok", "not_applicable", "failed", "ok"]
    assert set(comp.runs) == {BASELINE, "same network", "scaled eps"}


def test_identity_is_bit_identical_and_a_changed_output_is_reported(comparison):
    comp, _ = comparison
    t = comp.table.set_index("variant")
    assert t.loc["same network", "latent_rel_error"] == 0.0
    assert math.isinf(t.loc["same network", "image_psnr_db"])
    assert t.loc["scaled eps", "latent_rel_error"] > 1e-3
    psnr = t.loc["scaled eps", "image_psnr_db"]
    assert math.isfinite(psnr)
    assert ("changes the picture" in t.loc["scaled eps", "verdict"]) == (psnr < 40)
    lo, mid, hi = t.loc["same network", ["speedup_lo", "speedup", "speedup_hi"]]
    assert lo <= mid <= hi


def test_ratios_divide_the_baseline_timed_in_turn_not_the_first_one(comparison):
    comp, rows = comparison
    t = comp.table.set_index("variant")
    for variant in ("same network", "scaled eps"):
        beside, latency = t.loc[variant, ["fp32_in_turn_s", "latency_s"]]
        assert beside > 0 and t.loc[variant, "speedup"] == pytest.approx(beside / latency)
        stored = rows[(rows.scenario == f"{variant}, batch 1") & (rows.metric == "fp32_in_turn")]
        assert stored.value.tolist() == [pytest.approx(beside)]
    assert comp.runs["same network"].timing.peak_memory_bytes > 0  # from its own untimed call


def test_not_measured_rows_carry_the_reason_and_no_number(comparison):
    comp, rows = comparison
    t = comp.table.set_index("variant")
    assert t.loc["needs a GPU", "note"] == "not applicable: no CUDA device here"
    assert t.loc["raises", "note"] == "RuntimeError: planted failure"
    stored = rows.set_index("scenario")
    for scenario, status in (("needs a GPU, batch 1", "not_applicable"), ("raises, batch 1", "failed")):
        row = stored.loc[scenario]
        assert row["status"] == status and (row["value"] != row["value"])  # NaN: nothing measured


def test_every_measured_variant_stores_setup_first_call_drift_and_speedup(comparison):
    _, rows = comparison
    got = set(rows[rows.scenario == "same network, batch 1"]["metric"])
    assert {"latency", "latency_first_call", "setup", "peak_memory", "speedup_vs_fp32", "unet_step_speedup_vs_fp32",
            "latent_rel_error", "image_psnr_db", "percent_of_peak", "it_per_s", "s_per_image"} <= got
    assert "baseline_retime_ratio" in set(rows["metric"])


def test_a_failing_variant_leaves_no_pipeline_behind():
    """The runner drops the variant's pipeline whatever happens, so memory does not pile up across variants."""
    import gc
    import weakref

    from sdperf.comparison import Bench

    refs = []

    def keep_ref_then_fail(pipe):
        refs.append(weakref.ref(pipe.unet))
        raise RuntimeError("after apply")

    class Probe(Bench):
        def __init__(self):  # no baseline needed to exercise measure()'s clean-up
            self.study = open_study("smoke", notebook="zz_comparison")
            self.say, self.suffix = (lambda _m: None), ", batch 1"

    Probe().measure(Variant("leak check", apply=keep_ref_then_fail))
    gc.collect()
    assert refs and refs[0]() is None
