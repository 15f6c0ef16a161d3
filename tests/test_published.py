"""The one published table (sdperf/data/published.csv): its schema, its keys, one row per figure, every figure in
the source it was transcribed from, and the sizes the views read from its words."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from sdperf.config import published
from sdperf.core import tables
from sdperf.core.paths import REPO_ROOT
from sdperf.optimizations import catalog

SHARED = REPO_ROOT.parent / "shared"
COLUMNS = ["source", "url", "url_note", "hardware", "settings", "key", "what", "metric", "value", "unit", "detail",
           "why", "measured"]
# One figure: its source, where and under what it was taken, what it is of, which metric. `what` and `hardware` belong
# to it: one source publishes configurations no catalog key names (stable-fast, fused QKV), and the same sweep on
# A100 and H100 nodes.
IDENTITY = ["source", "hardware", "settings", "key", "what", "metric"]
RATIOS = ("speedup", "latency_ratio", "fid_change")  # divided or subtracted here or there: held to their parts
SEED_FILES = {"Cerebrium SD ladder": "cerebrium-sd-ladder.txt", "Paiton SDXL": "paiton-sdxl-mi300x.txt",
              **{s: "nemo-sd-performance.txt" for s in ("NeMo SD inference", "NeMo SD training", "NeMo SD FID-CLIP "
                                                        "protocol", "NeMo SD training A100 vs H100")}}


def _raw() -> pd.DataFrame:
    return tables.table(published.FILE, dtype=str, keep_default_na=False)


def test_the_table_has_one_schema_and_every_row_a_source_url_figure_and_unit():
    raw = _raw()
    assert list(raw.columns) == COLUMNS
    assert (raw.source != "").all() and raw.url.str.match(r"https://\S+$").all()
    figures = raw[raw.value != ""]
    assert pd.to_numeric(figures.value).notna().all() and (figures.unit != "").all() and (figures.metric != "").all()
    words = raw[raw.value == ""]  # a claim its source makes without a figure: said in `detail`, no unit
    assert len(words) and (words.unit == "").all() and (words.detail != "").all() and (words.metric != "").all()
    assert not raw.apply(lambda c: c.str.contains(r"seeds/|reference-numbers\.md")).any().any(), \
        "a row cites a file that is not in the repository"


def test_every_key_is_the_catalogs():
    for key in set(_raw().key) - {""}:
        for part in catalog.split(key):  # one technique, or a stack of them
            catalog.get(part)


def test_each_figure_is_one_row():
    raw = _raw()
    twice = raw[raw.duplicated(IDENTITY, keep=False)]
    assert twice.empty, f"rows of the same figure:\n{twice[IDENTITY].to_string()}"


def test_measured_cells_name_known_fields_and_what_they_compare():
    rows = published.compared()
    assert len(rows) == (_raw().measured != "").sum()
    assert (rows.measured_metric != "").all() and (rows.measured_what != "").all()
    assert ((rows.measured_key != "") | (rows.measured_scenario != "")).all()
    with pytest.raises(ValueError, match="unknown field"):
        published.lookup("notebook=00_baseline; keys=x; what=y")


def test_the_sizes_the_views_read_are_said_in_the_words():
    t = published.load()
    nemo = t[(t.source == "NeMo SD inference") & (t.metric == "latency")]
    assert sorted(set(nemo.batch_size)) == [1, 2, 4] and set(nemo.model) == {"SD 1.x", "SD 2.0"}
    sweep = t[(t.source == published.NEMO) & t.metric.isin(["samples_per_s", "perfect_linear", "speedup"])]
    assert sweep.gpus.notna().all() and (sweep.gpus == 8 * sweep.nodes).all()
    claim = t[t.what == "1 -> 2 nodes (8 -> 16 GPUs): training samples/s"]
    assert set(claim.gpus) == {16} and set(claim.nodes) == {2} and claim.measured.str.len().gt(0).all()


def _appears(figure: float, text: str) -> bool:
    """The figure as printed in a source: trailing zeros allowed ("4208.8" matches "4208.80"), thousands with or
    without a comma."""
    digits = f"{figure:.10g}"
    tail = r"0*" if "." in digits else r"(?:\.0+)?"
    forms = [re.escape(digits) + tail] + ([re.escape(f"{int(figure):,}")] if figure == int(figure) else [])
    return any(re.search(rf"(?<![\d.,]){f}(?![\d])", text) for f in forms)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the seeds live in ../shared beside the checkout (CI has it)")
def test_every_figure_appears_in_its_source():
    sheet = (SHARED / "reference-numbers.md").read_text()
    t = published.load()
    for r in t[t.value.notna() & ~t.metric.isin(RATIOS)].itertuples():
        text = (SHARED / "seeds" / SEED_FILES[r.source]).read_text() if r.source in SEED_FILES else sheet
        assert _appears(r.value, text), f"{r.value:g} ({r.source}, {r.what}) not in its source"
