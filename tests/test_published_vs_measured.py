"""The published-vs-measured table: every claim cites a URL, every seed is in it, and the measured side comes from
the rows given (a changed row changes the table; a missing or not-applicable one says so, with its reason)."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from sdperf.report import published_vs_measured as pvm
from sdperf.core.errors import ConfigError
from sdperf.core.paths import REPO_ROOT

SHARED = REPO_ROOT.parent / "shared"
SEEDS = {"Cerebrium SD ladder": "https://www.cerebrium.ai/blog/",
         "Paiton SDXL": "https://www.evp.cloud/post/",
         "Google Cloud pipeline guide": "https://cloud.google.com/blog/",
         "NeMo SD inference": "https://docs.nvidia.com/nemo-framework/"}
SEED_FILES = {"Cerebrium SD ladder": "cerebrium-sd-ladder.txt", "Paiton SDXL": "paiton-sdxl-mi300x.txt",
              "NeMo SD inference": "nemo-sd-performance.txt", "NeMo SD training": "nemo-sd-performance.txt"}
FP16 = dict(notebook="01_half_precision", key="precision:float16", scenario="float16 weights+activations, batch 1",
            metric="seed_speedup_vs_fp32", unit="x", status="ok", method="fresh process per configuration",
            note="faster (noise band 0.97-1.03x)", time_utc="2026-01-01T00:00:00Z")
CLAIM = "fp32 -> fp16 (torch.float16)"


def _row(table: pd.DataFrame, claim: str, source: str = "Cerebrium SD ladder") -> pd.Series:
    return table[(table.claim == claim) & (table.source == source)].iloc[0]


def _results(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows)).reindex(columns=["notebook", "scenario", "metric", "value", "unit", "p10", "p90",
                                                     "lo", "hi", "n", "status", "method", "key", "note", "time_utc"])


def test_every_seed_and_source_is_in_the_table_with_its_url():
    t = pvm.table(_results())
    for source, prefix in SEEDS.items():
        mine = t[t.source == source]
        assert len(mine) and mine.url.str.startswith(prefix).all(), source
    assert set(t.source) == set(pvm.claims().source)
    assert (t.url_note[t.source == "Google Cloud pipeline guide"].str.contains("url not found for the English")).all()


def test_the_measured_figure_comes_from_the_rows_and_follows_them():
    rows = _results(dict(FP16, value=0.9, lo=0.85, hi=0.95))
    row = _row(pvm.table(rows), CLAIM)
    assert (row.measured_x, row.measured) == (0.9, "0.900x [0.850-0.950]")
    assert row.method == "fresh process per configuration" and "per image at 50 PLMS steps" in row.measured_what
    changed = _row(pvm.table(_results(dict(FP16, value=1.7, lo=1.6, hi=1.8))), CLAIM)
    assert (changed.measured_x, changed.measured) == (1.7, "1.70x [1.60-1.80]")
    assert row.published == 2.46 and row.published_detail == "11.26 s -> 4.57 s"  # the published side stays put


def test_a_missing_or_unmeasured_row_says_not_measured_with_its_reason():
    missing = _row(pvm.table(_results()), CLAIM)
    assert pd.isna(missing.measured_x) and missing.measured.startswith("not measured here: no row of notebook "
                                                                       "01_half_precision, key precision:float16")
    skipped = _results(dict(FP16, metric="latency", status="skipped", value=None,
                            note="skipped: 3 whole generations would take 900 s"))
    row = _row(pvm.table(skipped), CLAIM)
    assert pd.isna(row.measured_x) and row.measured == "not measured here: skipped: 3 whole generations would take " \
                                                      "900 s"
    assert row.measured_what == "" and row.method == ""


def test_alternative_keys_take_the_first_measured_and_ratios_pair_their_rows():
    engine = dict(FP16, notebook="07_engine_export", key="engine:openvino-f32",
                  scenario="engine:openvino-f32, batch 1", value=1.4, lo=1.3, hi=1.5)
    trt = dict(engine, key="engine:tensorrt-fp16", scenario="engine:tensorrt-fp16, batch 1", metric="latency",
               status="not_applicable", value=None, note="not applicable: needs an NVIDIA GPU")
    t = pvm.table(_results(trt, engine))
    assert _row(t, "framework -> TensorRT engine, batch 1", "NeMo SD inference").measured == "1.40x [1.30-1.50]"
    base = dict(notebook="00_baseline", metric="latency", unit="s", status="ok", method="fresh processes")
    t = pvm.table(_results(dict(base, scenario="fp32 eager, batch 1", value=10.0),
                           dict(base, scenario="fp32 eager, batch 2", value=16.0)))
    row = _row(t, "latency of batch 2 over batch 1 (below 2.0: batching pays)", "NeMo SD inference")
    assert (row.measured_x, row.measured) == (1.6, "1.60x (ratio of medians)")


FIGURES = re.compile(r"^(FID )?~?(-?[\d.]+)[^\d>]*-> ~?(-?[\d.]+)")  # "11.26 s -> 4.57 s", "FID 33.12 -> 33.02"


def test_each_published_ratio_agrees_with_the_figures_it_divides():
    """published (typed once) against the two figures its detail divides: a ratio either way, or b - a for a
    change in FID; within the rounding of the typed figure. Details that quote other figures are not ratios' own."""
    t = pvm.claims()
    t = t[t.published.notna()]
    checked = 0
    for r in t.itertuples():
        m = FIGURES.match(r.published_detail)
        if m is None or (m.group(1) is not None) != (r.published_unit == "FID change"):
            continue
        a, b, p = float(m.group(2)), float(m.group(3)), float(r.published)
        if r.published_unit == "FID change":
            assert b - a == pytest.approx(p, abs=0.005), r.claim
        else:
            assert min(abs(a / b - p), abs(b / a - p)) <= 0.006 * p, (r.claim, a, b, p)
        checked += 1
    assert checked >= len(t) // 2


@pytest.mark.skipif(not SHARED.is_dir(), reason="the seeds live in ../shared beside the checkout (CI has it)")
def test_every_published_figure_of_a_claim_appears_in_its_source():
    sheet = (SHARED / "reference-numbers.md").read_text()
    for r in pvm.claims().itertuples():
        text = (SHARED / "seeds" / SEED_FILES[r.source]).read_text() if r.source in SEED_FILES else sheet
        for figure in re.findall(r"\d+(?:\.\d+)?", r.published_detail.replace("5,000", "5000")):
            if figure in ("2", "5000", "100", "128", "3.22"):  # "2 concurrent requests", "5,000 captions", "x100",
                continue  # "128%", and the ratio of DeepCache's rounded times, worked out here
            assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", text + sheet), (r.source, figure)


def test_every_measured_key_and_notebook_is_the_catalogs():
    from sdperf.optimizations import catalog

    for r in pvm.claims().itertuples():
        for key in filter(None, r.measured_key.split(pvm.ALTERNATIVE)):
            try:  # one technique (a parametric spec may hold a '+' of its own) ...
                one = catalog.get(key)
            except ConfigError:  # ... or a stack of them, each of which must exist
                one = [catalog.get(k) for k in key.split(catalog.STACK_SEP)] and None
            if one is not None:
                assert r.measured_notebook in ("", one.notebook), (key, r.measured_notebook)


def test_the_report_shows_the_table_after_the_findings_with_a_link_per_source(scratch_reports):
    from sdperf.core import environment
    from sdperf.report import report
    from sdperf.store.results import Recorder

    rec = Recorder("01_half_precision", "smoke", environment.record("smoke", "cpu"))
    rec.add("float16 weights+activations, batch 1", "seed_speedup_vs_fp32", 0.912345, "x", lo=0.9, hi=0.95,
            key="precision:float16", method="fresh process per configuration", batch_size=1)
    rec.not_applicable("CUDA graph (UNet step), batch 1", "needs <CUDA> & a GPU")
    page = report.write_index("smoke").read_text()
    section = page[page.index("<h2 id='published'>"):]
    assert page.index("id='findings'") < page.index("id='published'") < page.index("id='summary'")
    assert "<b>0.912x [0.900-0.950]</b>" in section  # the row's figure, not a typed one
    assert "not measured here: no row of notebook 10_ladder" in section
    for url in pvm.claims().url.unique():
        assert f"<a href='{url}'>" in section
    why = pvm.claims().why_they_differ.iloc[0]
    assert report._esc(why) in section  # whole, not cut short


class _Cmp:
    """What 08's published-vs-measured table reads of a comparison."""

    method = "fresh process per configuration"

    def __init__(self, speedups: dict[str, float]):
        self.speedups = speedups

    def ok(self) -> pd.DataFrame:
        return pd.DataFrame([{"key": k, "speedup": v, "speedup_lo": v - 0.1, "speedup_hi": v + 0.1,
                              "speedup_verdict": "faster"} for k, v in self.speedups.items()])


class _Study:
    def conditions(self, batch_size: int = 1, scope: str = "whole generation") -> str:
        return f"{scope}; batch {batch_size}"


def test_08_sets_each_published_int8_figure_beside_the_same_technique():
    from sdperf.experiments import quantization

    t = quantization.published_vs_measured(_Study(), _Cmp({"int8:torchao-int8-dynamic": 0.92,
                                                           "int8:openvino-nncf-ptq": 2.09}))
    dynamic, static = t.iloc[0], t.iloc[1]
    assert dynamic.published == 1.04 and dynamic.measured_here == 0.92  # the report's figure; not the fastest
    assert dynamic.published_detail == "2.52 s -> 2.43 s" and "A100" in dynamic.hardware
    assert "dynamic int8 of the Linear layers" in dynamic.measured_conditions
    assert static.measured_here == 2.09 and "post-training static int8" in static.measured_conditions
    assert "quantization-aware" in static.claim and "lossy" in static.measured_conditions
    assert all("https://" in s for s in t.source)


def test_10_compares_the_whole_ladder_only_when_every_rung_ran_and_it_s_per_step():
    from sdperf.experiments import ladder

    def lad(name, rows):
        cols = ["rung", "key", "stack", "status", "note", "vs_rung_below", "speedup", "speedup_verdict",
                "seed_speedup", "unet_step_speedup", "method"]
        return ladder.Ladder(name, [], pd.DataFrame(rows, columns=cols))

    ran = dict(status="ok", note="", method="rounds")
    cer = lad("Cerebrium", [dict(ran, rung=2, key="precision:float16", vs_rung_below=0.8, seed_speedup=0.9),
                            dict(ran, rung=3, key="grad:inference_mode", vs_rung_below=0.97, seed_speedup=0.87),
                            dict(rung=4, key="deepspeed:inject", status="not_applicable",
                                 note="not applicable: CUDA kernels")])
    t = ladder.published_vs_measured(_Study(), cer, lad("best", [])).set_index("claim")
    whole = t.loc["the whole ladder (fp32 -> DeepSpeed)"]
    assert pd.isna(whole.measured_here) and "not applicable: CUDA kernels" in whole.measured_conditions
    assert "not the whole ladder" in whole.measured_conditions
    before = t.loc["fp32 -> fp16 -> inference_mode (the rungs before DeepSpeed)"]
    assert before.measured_here == 0.87 and before.published == pytest.approx(11.26 / 4.53)
    assert t.loc["fp32 -> fp16"].measured_here == 0.8
    paiton = t.loc["PyTorch + diffusers -> custom kernels (it/s)"].measured_conditions
    assert paiton.startswith("per UNet step") and "whole generation" not in paiton


def test_13_takes_the_busy_fraction_from_00s_batch_rows_when_it_timed_batch_1_only():
    from sdperf.experiments import serving as experiment
    from sdperf.serving import sharing

    base = dict(notebook="00_baseline", metric="latency", status="ok", key="fp32-eager")
    rows = pd.DataFrame([dict(base, scenario="fp32 eager, batch 1", value=9.0, batch_size=1),
                         dict(base, scenario="fp32 eager, batch 2", value=15.0, batch_size=2),
                         dict(base, scenario="fp32 eager (twin), batch 4", value=99.0, batch_size=4),
                         dict(base, scenario="fp32 eager, batch 4", value=None, status="skipped", batch_size=4)])
    assert experiment.baseline_batches(rows) == (9.0, 15.0, 2)
    assert experiment.baseline_batches(rows[rows.scenario != "fp32 eager, batch 2"]) is None
    busy = sharing.busy_fraction(*experiment.baseline_batches(rows))
    assert busy[0] == pytest.approx(15.0 / 2 / 9.0)
    t = sharing.estimate(9.0, measured_busy=(busy[0], "from 00"))
    assert (t.busy_fraction == busy[0]).all() and (t.busy_fraction_from == "from 00").all()
    assert (sharing.estimate(9.0).busy_fraction == 1.0).all()  # no batch anywhere: assumed, and said so
