"""The report's findings are written from rows: change a row and the sentence changes; another machine's rows never
enter a table."""
from __future__ import annotations

import pandas as pd
import pytest

from sdperf import findings, report
from sdperf.results import COLUMNS

METHOD = "fresh process per configuration, 3 rounds"


def _row(**kw) -> dict:
    base = {c: None for c in COLUMNS}
    base.update(notebook="03_attention", status="ok", method=METHOD, unit="x", machine="m1", commit="c1",
                time_utc="2026-11-25T00:00:00Z")
    base.update(kw)
    return base


def _speed(scenario, key, value, lo, hi, band) -> dict:
    return _row(scenario=f"{scenario}, batch 1", metric="seed_speedup_vs_fp32", key=key, value=value, lo=lo, hi=hi,
                note=f"per image at 50 PLMS steps; {band} (noise band 0.94-1.06x)")


def _rows(best: float) -> pd.DataFrame:
    return pd.DataFrame([
        _speed("fp32 eager (twin)", "fp32-eager", 1.02, 0.99, 1.07, "within noise"),
        _speed("tome:0.3", "tome:0.3", best, best - 0.05, best + 0.04, "faster"),
        _speed("SDPA math only", "attention:sdpa:math", 0.93, 0.90, 0.97, "slower"),
        _row(scenario="SDPA cudnn only, batch 1", metric="latency", key="attention:sdpa:cudnn",
             status="not_applicable", note="not applicable: no cuDNN kernel on a CPU"),
    ], columns=COLUMNS)


@pytest.mark.parametrize("best", [1.31, 2.47])
def test_the_speed_finding_is_written_from_the_rows(best):
    text = findings.verdict("03_attention", _rows(best))
    assert f"<b>tome:0.3</b>, {best:.2f}x [{best - 0.05:.2f}-{best + 0.04:.2f}] per image over fp32 eager" in text
    assert "faster than the noise floor (0.94-1.06x)" in text and f"method: {METHOD}" in text
    assert "fastest of 2" in text  # the twin is the floor, not a contender
    assert "1 faster" in text and "1 slower" in text
    assert "1 not applicable (e.g. not applicable: no cuDNN kernel on a CPU)" in text


def test_the_quality_finding_counts_verdicts_and_names_the_worst():
    rows = pd.DataFrame([
        _row(notebook="12_fid_clip", metric="reference_adherence_delta", key=k, value=v, lo=v - 0.01, hi=v + 0.01,
             note=f"{verdict} (adherence interval above -0.01)")
        for k, v, verdict in (("fp32-eager", 0.0, "within budget"), ("tome:0.5", -0.040, "over budget"),
                              ("int8:x", -0.021, "over budget"), ("compile:default", 0.0, "within budget"))
    ], columns=COLUMNS)
    text = findings.verdict("12_fid_clip", rows)
    assert "3 techniques" in text and "2 over budget" in text and "1 within budget" in text
    assert "<b>tome:0.5</b> -0.040 [-0.050--0.030]" in text


def test_a_notebook_without_comparisons_says_what_it_measured():
    rows = pd.DataFrame([_row(notebook="05_cuda_graphs", scenario="CUDA graph", metric="latency",
                              status="not_applicable", note="not applicable: needs an NVIDIA GPU")], columns=COLUMNS)
    assert findings.verdict("05_cuda_graphs", rows) == \
        "nothing measured; 1 not applicable (e.g. not applicable: needs an NVIDIA GPU)."


def test_rows_of_another_machine_or_commit_are_refused_and_counted():
    rows = _rows(1.31).assign(time_utc="2026-11-25T10:00:00Z")  # the latest run's
    other = _rows(9.99).assign(machine="m2")
    old = _rows(7.77).assign(commit="c0")
    shown, notice = report.one_machine(pd.concat([other, rows, old], ignore_index=True))
    assert len(shown) == len(rows) and set(shown["machine"]) == {"m1"} and set(shown["commit"]) == {"c1"}
    assert "4 row(s) at commit c1 on machine m2" in notice and "4 row(s) at commit c0 on machine m1" in notice
    text = findings.verdict("03_attention", shown)
    assert "9.99" not in text and "7.77" not in text and "1.31x" in text
    assert report.one_machine(rows)[1] == ""
