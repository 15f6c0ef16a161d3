"""The transcribed training tables: every figure appears in its source and in the shared reference sheet."""
from __future__ import annotations

import re

import pytest

from sdperf.core.paths import REPO_ROOT
from sdperf.training import published

SHARED = REPO_ROOT.parent / "shared"


def _appears(figure: float, text: str) -> bool:
    """The figure as printed in the source, trailing zeros allowed ("4208.8" matches "4208.80", 1100 "1100")."""
    digits = f"{figure:.10g}"
    tail = r"0*" if "." in digits else r"(?:\.0+)?"
    return re.search(rf"(?<![\d.]){re.escape(digits)}{tail}(?![\d])", text) is not None


def test_every_row_names_its_source_and_hardware():
    df = published.load()
    assert not df[["source", "url", "hardware", "metric", "value", "unit"]].isna().any().any()
    assert "source_file" not in df  # a file outside the repository is no citation; the URL is
    assert set(df.url) == {"https://docs.nvidia.com/nemo-framework/user-guide/latest/multimodalmodels/text2image/"
                           "stablediffusion/perf.html", "https://github.com/mosaicml/diffusion"}
    nemo = df[df.source.str.startswith("NeMo")]
    assert (nemo.gpus == 8 * nemo.nodes).all()  # DGX nodes of 8 GPUs
    t = published.throughput()
    assert t.groupby("curve").size().to_dict() == {
        "NeMo DGX A100, SD v2, 512px": 7, "NeMo DGX H100, SD v2, 512px": 7,
        "MosaicML A100, SD2-base UNet, 256px": 5, "MosaicML A100, SD2-base UNet, 512px": 5}


@pytest.mark.skipif(not SHARED.is_dir(), reason="the seeds live in ../shared beside the checkout (CI has it)")
def test_every_figure_appears_in_its_source_file():
    for row in published.load().itertuples():
        name = "seeds/nemo-sd-performance.txt" if row.source.startswith("NeMo") else "reference-numbers.md"
        text = (SHARED / name).read_text()
        assert _appears(row.value, text), f"{row.value} not in {name}"


@pytest.mark.skipif(not SHARED.is_dir(), reason="the seeds live in ../shared beside the checkout (CI has it)")
def test_throughput_figures_agree_with_the_reference_sheet():
    """reference-numbers.md transcribes the same tables; a typo in either file shows up here."""
    sheet = (SHARED / "reference-numbers.md").read_text()
    rows = published.load()
    rows = rows[rows.metric.isin(["samples_per_s", "global_batches_per_s"])]
    for row in rows.itertuples():
        assert _appears(row.value, sheet), f"{row.value} ({row.source}) not in reference-numbers.md"
