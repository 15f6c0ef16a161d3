"""The ladder: how the best order is chosen, what a rung that cannot run or does not help leaves behind."""
from __future__ import annotations

import time

import pandas as pd
import pytest

from sdperf.comparison import Bench
from sdperf.experiments import ladder
from sdperf.study import open_study


def _alone(rows):
    return pd.DataFrame(rows, columns=["key", "technique", "family", "notebook", "status", "speedup", "image_psnr_db"])


def test_best_order_keeps_one_executor_drops_slower_and_lossy_and_sorts_fastest_first():
    t = _alone([
        ("compile", "+ compile", ladder.EXECUTOR, "04", "ok", 1.5, 120.0),
        ("onnx", "+ onnx", ladder.EXECUTOR, "07", "ok", 1.4, float("inf")),
        ("int8", "+ int8", ladder.EXECUTOR, "08", "ok", 3.0, 25.0),  # fastest, but changes the picture
        ("sdpa", "+ sdpa", "attention", "03", "ok", 1.05, float("inf")),
        ("fp16", "+ fp16", "precision", "01", "ok", 0.4, 48.0),
        ("graphs", "+ graphs", "graphs", "05", "not_applicable", None, None),
    ])
    order, why = ladder.best_order(t)
    assert order == ["sdpa", "compile"]
    reasons = dict(zip(why.key, why.why))
    assert reasons["int8"].startswith("changes the picture")
    assert reasons["onnx"].startswith("another executor was faster")
    assert reasons["fp16"].startswith("not faster than fp32 alone")
    assert reasons["graphs"] == "not_applicable in 05"
    lossy, _ = ladder.best_order(t, allow_lossy=True)
    assert lossy == ["sdpa", "int8"]


def _sleepy(pipe):
    """A rung that makes every UNet call slower: the ladder must measure it and leave it out of the stack."""
    forward = pipe.unet.forward

    def slow(*args, **kwargs):
        time.sleep(0.3)  # several times a tiny UNet call: slower beyond any timing noise
        return forward(*args, **kwargs)

    pipe.unet.forward = slow
    return pipe


@pytest.fixture(scope="module")
def climbed(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDPERF_REPORTS_DIR", str(tmp_path_factory.mktemp("reports")))
        mp.setattr(ladder, "_registered", lambda study: [ladder.Technique(
            "sleepy", "+ sleepy", "executor", "zz", "sleepy", (True, "test"), _sleepy)])
        study = open_study("smoke", notebook="10_ladder")
        bench = Bench(study, say=lambda _m: None)
        cere = ladder.climb(study, bench, "Cerebrium order", ["no_grad", "deepspeed", "cuda_graphs"],
                            keep_only_faster=False, say=lambda _m: None)
        best = ladder.climb(study, bench, "best order here", ["sleepy"], keep_only_faster=True,
                            say=lambda _m: None)
        bench.close()
        yield study, cere, best, study.recorder.table()


def test_gpu_rungs_say_why_on_cpu_and_the_stack_goes_on(climbed):
    _, cere, _, rows = climbed
    t = cere.table.set_index("technique")
    assert t.loc["fp32, no_grad (diffusers' pipeline call)", "status"] == "ok"
    for label in ("+ DeepSpeed kernel injection", "+ CUDA graphs"):
        assert t.loc[label, "status"] == "not_applicable" and not t.loc[label, "in_stack"]
        assert t.loc[label, "note"].startswith("not applicable: ")
    stored = rows[rows.scenario.str.contains("CUDA graphs")]
    assert stored.status.tolist() == ["not_applicable"] and stored.value.isna().all()


def test_a_rung_that_is_slower_is_measured_but_not_kept(climbed):
    _, _, best, rows = climbed
    t = best.table.set_index("technique")
    assert t.loc["+ sleepy", "status"] == "ok" and not t.loc["+ sleepy", "in_stack"]
    assert t.loc["+ sleepy", "vs_rung_below"] < 1.0
    assert t.loc["+ sleepy", "note"].startswith("not kept")
    assert ladder.best_recipe(best)["recipe"] == "fp32 eager (nothing beat it)"
    assert "speedup_vs_rung_below" in set(rows.metric)


def test_unknown_rung_is_named_with_the_valid_ones(climbed):
    study = climbed[0]
    with pytest.raises(ValueError, match=r"unknown ladder rung\(s\) warp-drive; valid: no_grad"):
        ladder.climb(study, None, "x", ["warp-drive"], keep_only_faster=True)


def test_report_shows_the_ladder_first(climbed):
    from sdperf import report

    study = climbed[0]
    page = report.write_index(study.profile.name).read_text()
    assert "<h2 id='ladder'>The ladder</h2>" in page
    assert page.index("id='ladder'") < page.index("id='environment'")
    assert "Cerebrium order 3: + CUDA graphs" in page and "not applicable: device" in page
