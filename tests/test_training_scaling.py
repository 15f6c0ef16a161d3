"""The efficiency math, on tables with a known answer and against NeMo's own Speedup / Perfect Linear rows."""
from __future__ import annotations

import pandas as pd
import pytest

from sdperf.config import published
from sdperf.training import scaling


def test_scaling_on_a_table_with_a_known_answer():
    t = pd.DataFrame({"n": [4, 1, 2], "x": [320.0, 100.0, 180.0]})  # unsorted on purpose
    out = scaling.scaling(t, "n", "x").set_index("n")
    assert out.loc[[1, 2, 4], "speedup"].tolist() == pytest.approx([1.0, 1.8, 3.2])
    assert out.loc[[1, 2, 4], "efficiency"].tolist() == pytest.approx([1.0, 0.9, 0.8])
    assert out.loc[[1, 2, 4], "perfect_linear"].tolist() == pytest.approx([100.0, 200.0, 400.0])
    assert (out["base_size"] == 1).all()


def test_each_group_is_normalized_to_its_own_smallest_size():
    t = pd.DataFrame({"curve": ["a", "a", "b", "b"], "n": [8, 16, 2, 4], "x": [10.0, 15.0, 7.0, 14.0]})
    out = scaling.scaling(t, "n", "x", ["curve"]).set_index(["curve", "n"])
    assert out.loc[("a", 16), "efficiency"] == pytest.approx(0.75)
    assert out.loc[("b", 4), "efficiency"] == pytest.approx(1.0)
    assert out.loc[("a", 16), "scale"] == 2 and out.loc[("b", 4), "base_size"] == 2


@pytest.mark.parametrize("metric,column,tolerance", [("speedup", "speedup", 0.01),
                                                     ("perfect_linear", "perfect_linear", 1e-4)])
def test_published_curves_reproduce_nemos_own_rows(metric, column, tolerance):
    """NeMo printed its Speedup (2 decimals) and Perfect Linear Scaling rows from an unrounded 1-node figure,
    so the match is within that rounding: 0.01x absolute, 1e-4 relative."""
    curves = scaling.published_curves()
    stated = published.select(published.NEMO, metric=metric)  # its own Speedup / Perfect Linear rows
    assert len(stated) == 14
    for row in stated.itertuples():
        ours = curves[(curves.hardware == row.hardware) & (curves.nodes == row.nodes)][column].item()
        if metric == "speedup":
            assert ours == pytest.approx(row.value, abs=tolerance), (row.hardware, row.nodes)
        else:
            assert ours == pytest.approx(row.value, rel=tolerance), (row.hardware, row.nodes)


def _measured(rows):
    cols = ["engine", "world_size", "per_rank_batch", "threads_per_rank", "samples_per_s", "status", "control"]
    df = pd.DataFrame(rows, columns=cols)
    return df.assign(global_batch=df.world_size * df.per_rank_batch)


def test_weak_strong_and_equal_threads_on_a_known_sweep():
    m = _measured([
        ("ddp", 1, 1, 2, 10.0, "ok", False), ("ddp", 1, 2, 2, 16.0, "ok", False),
        ("ddp", 2, 1, 1, 12.0, "ok", False), ("ddp", 2, 2, 1, 20.0, "ok", False),
        ("ddp", 1, 1, 1, 8.0, "ok", True), ("ddp", 1, 2, 1, 9.0, "ok", True),   # equal-threads controls
        ("zero1", 2, 1, 1, None, "failed", False),
    ])
    weak = scaling.weak(m).set_index(["per_rank_batch", "world_size"])
    assert weak.loc[(1, 2), "speedup"] == pytest.approx(1.2) and weak.loc[(1, 2), "efficiency"] == pytest.approx(0.6)
    assert weak.loc[(2, 2), "efficiency"] == pytest.approx(20 / 16 / 2)
    assert len(weak) == 4  # controls and failures are not points of a curve
    strong = scaling.strong(m)
    assert strong.global_batch.unique().tolist() == [2]  # only global batch 2 exists at two world sizes
    s = strong.set_index("world_size")
    assert s.loc[2, "per_rank_batch"] == 1 and s.loc[2, "speedup"] == pytest.approx(12 / 16)
    eq = scaling.equal_threads(m).set_index("per_rank_batch")
    assert eq.loc[1, "efficiency"] == pytest.approx(12 / (2 * 8))
    assert eq.loc[2, "efficiency"] == pytest.approx(20 / (2 * 9))


def test_ratio_and_the_nemo_a100_to_h100_figure():
    t = pd.DataFrame({"k": [1, 1, 2, 2, 3], "chip": ["A", "B", "A", "B", "A"], "value": [2.0, 5.0, 4.0, 6.0, 9.0]})
    r = scaling.ratio(t, "k", "chip", "B", "A")
    assert r.k.tolist() == [1, 2] and r.ratio.tolist() == pytest.approx([2.5, 1.5])
    table = scaling.a100_to_h100()
    comp = table[~table.table.str.startswith("node sweep")].iloc[0]
    assert comp.ratio == pytest.approx(1.972 / 1.056) and round(comp.ratio, 1) == comp.stated == 1.9
    assert len(table[table.table.str.startswith("node sweep")]) == 7


def test_every_scaling_ratio_recorded_names_its_method(scratch_reports):
    """The brief: the method named in every row. The scaling rows come from single launches, not rounds: their
    method says so."""
    from sdperf.experiments import training_scaling as experiment
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="test_training_scaling")
    experiment.scaling_tables(study, _measured([
        ("ddp", 1, 1, 2, 10.0, "ok", False), ("ddp", 1, 2, 2, 16.0, "ok", False),
        ("ddp", 2, 1, 1, 12.0, "ok", False), ("ddp", 2, 2, 1, 20.0, "ok", False),
        ("ddp", 1, 1, 1, 8.0, "ok", True)]))
    rows = study.recorder.table()
    assert set(rows.metric) == {"speedup", "scaling_efficiency", "equal_threads_efficiency"}
    assert (rows.method == experiment.SCALING_METHOD).all() and "no rounds" in experiment.SCALING_METHOD


def test_every_configuration_figure_recorded_names_its_launch(scratch_reports):
    """samples/s, step times, memory and the rank check come from one launch per configuration: the rows say so."""
    from sdperf.experiments import training_scaling as experiment
    from sdperf.measure.study import open_study
    from sdperf.training.training_settings import from_profile

    study = open_study("smoke", notebook="test_training_scaling")
    ok = dict(label="ddp, world 2, batch 1/rank", status="ok", note="", timed_steps=5, world_size=2,
              threads_per_rank=1, backend="gloo", unet="tiny", samples_per_s=4.0, samples_per_s_p10=3.5,
              samples_per_s_p90=4.5, global_batch=2, step_time_s=0.5, step_time_p10_s=0.45, step_time_p90_s=0.6,
              first_step_s=2.0, peak_memory_mib=900.0, peak_memory_mib_per_rank=[900.0, 880.0], memory_kind="rss",
              training_memory_mib=300.0, params_identical=True)
    failed = dict(ok, label="zero1, world 2, batch 1/rank", status="failed", note="RuntimeError: boom")
    experiment.record(study, pd.DataFrame([ok, failed]), from_profile(study.profile))
    rows = study.recorder.table()
    figures = rows[rows.scenario == ok["label"]]
    assert set(figures.metric) == {"samples_per_s", "step_time", "first_step", "peak_memory_per_rank",
                                   "training_memory_per_rank", "params_identical_across_ranks"}
    assert (figures.method == experiment.LAUNCH_METHOD).all() and "no rounds" in experiment.LAUNCH_METHOD
    assert rows[rows.scenario == failed["label"]].status.tolist() == ["failed"]  # a failure is a row, not a figure
