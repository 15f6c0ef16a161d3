"""The published quality figures: the view 12 shows, each with a source, and the MLPerf gate's bounds read from it."""
from __future__ import annotations

from sdperf.config import published
from sdperf.experiments.fid_clip import PUBLISHED_COLUMNS, published_quality
from sdperf.quality import gate


def test_every_row_names_its_source_and_the_gate_bounds_are_ordered():
    t = published.quality()
    assert t.url.str.startswith("https://").all() and t.value.notna().all()
    assert set(t.metric) <= set(published.QUALITY)
    assert gate.bounds("fid") == (23.01085758, 23.95007626) and gate.bounds("clip_score") == (31.68631873, 31.81331801)
    assert list(published_quality().columns) == PUBLISHED_COLUMNS


def test_a_techniques_published_cost_is_what_its_rows_say():
    t = published.technique_quality()
    assert t.loc["tome:0.5", "published_cost"] == "FID 33.12 -> 33.02 (at 1.87x)"
    assert "tomesd README (https://github.com/dbolya/tomesd)" == t.loc["tome:0.5", "published_source"]
    both = t.loc["scheduler:dpmpp-2m@20"]  # a statement and a figure from two sources, each named once
    assert "(no figure)" in both.published_cost and "latent MSE 0.30" in both.published_cost
    assert both.source == "diffusers scheduler docs; DPM-Solver-v3 (Zheng et al. 2023), sec. 4.1"
