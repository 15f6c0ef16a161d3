"""The published training sweeps (NeMo's DGX A100/H100 node sweep and A100-vs-H100 table, MosaicML's A100 sweep):
the view 11 reads, and its figures against the shared reference sheet."""
from __future__ import annotations

import pytest

from sdperf.config import published
from sdperf.core.paths import REPO_ROOT

from test_published import _appears

SHARED = REPO_ROOT.parent / "shared"


def test_every_row_names_its_source_and_hardware():
    t = published.throughput()
    assert (t[["source", "url", "hardware", "metric", "unit"]] != "").all().all() and t.value.notna().all()
    assert set(t.url) == {"https://docs.nvidia.com/nemo-framework/user-guide/latest/multimodalmodels/text2image/"
                          "stablediffusion/perf.html", "https://github.com/mosaicml/diffusion"}
    nemo = t[t.source == published.NEMO]
    assert (nemo.gpus == 8 * nemo.nodes).all()  # DGX nodes of 8 GPUs
    assert t.groupby("curve").size().to_dict() == {
        "NeMo DGX A100, SD v2, 512px": 7, "NeMo DGX H100, SD v2, 512px": 7,
        "MosaicML A100, SD2-base UNet, 256px": 5, "MosaicML A100, SD2-base UNet, 512px": 5}


@pytest.mark.skipif(not SHARED.is_dir(), reason="the seeds live in ../shared beside the checkout (CI has it)")
def test_throughput_figures_agree_with_the_reference_sheet():
    """reference-numbers.md transcribes the same tables as the seed; a typo in either file shows up here."""
    sheet = (SHARED / "reference-numbers.md").read_text()
    rows = published.load()
    rows = rows[rows.source.isin([published.NEMO, published.NEMO_AB, published.MOSAIC])
                & rows.metric.isin(["samples_per_s", "global_batches_per_s"])]
    assert len(rows) == 26
    for row in rows.itertuples():
        assert _appears(row.value, sheet), f"{row.value} ({row.source}) not in reference-numbers.md"
