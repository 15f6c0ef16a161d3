"""The published quality figures: transcribed from the reference notes / seeds, each with a source."""
from __future__ import annotations

import re

import pytest

from sdperf.core.paths import REPO_ROOT
from sdperf.quality import gate

SHARED = REPO_ROOT.parent / "shared"


def test_every_row_names_its_source_and_the_gate_bounds_are_ordered():
    t = gate.published()
    assert t.source_url.notna().all() and (t.source_url.str.startswith("https://")).all()
    assert gate.bounds("fid") == (23.01085758, 23.95007626) and gate.bounds("clip_score") == (31.68631873, 31.81331801)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the reference notes live in ../shared beside the checkout")
def test_published_quality_figures_appear_in_the_reference_notes():
    text = (SHARED / "reference-numbers.md").read_text() + "".join(
        p.read_text() for p in (SHARED / "seeds").glob("*.txt"))
    for row in gate.published().itertuples():
        figure = f"{int(row.value):,}" if row.value == int(row.value) else repr(float(row.value))
        assert re.search(rf"(?<![\d.,]){re.escape(figure)}(?![\d])", text), f"{figure} ({row.source}) not found"
