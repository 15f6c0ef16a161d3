"""The report's findings are written from rows: change a row and the sentence changes; another machine's rows never
enter a table."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from sdperf.report import findings, report
from sdperf.store.results import COLUMNS

METHOD = "fresh process per configuration, 3 rounds"


def _row(**kw) -> dict:
    base = {c: None for c in COLUMNS}
    base.update(notebook="03_attention", status="ok", method=METHOD, unit="x", machine="m1", commit="c1",
                time_utc="2026-11-25T00:00:00Z")
    base.update(kw)
    return base


def _speed(scenario, key, value, lo, hi, verdict) -> dict:
    """A compared row as comparison.record writes it: the verdict in its column (the note is for readers only, and
    here says nothing of it, so a finding that read prose would miss it)."""
    return _row(scenario=f"{scenario}, batch 1", metric="seed_speedup_vs_fp32", key=key, value=value, lo=lo, hi=hi,
                batch_size=1, verdict=verdict, note="per image at 50 PLMS steps")


def _rows(best: float) -> pd.DataFrame:
    return pd.DataFrame([
        _row(scenario="noise floor, batch 1", metric="seed_speedup_noise_band", key="fp32-eager", value=1.06, lo=0.94,
             hi=1.06, batch_size=1, note="fp32 eager against its twin"),
        _row(scenario="noise floor, batch 2", metric="seed_speedup_noise_band", key="fp32-eager", value=1.2, lo=0.8,
             hi=1.2, batch_size=2, note="another batch's floor, not this row's"),
        _speed("fp32 eager (twin)", "fp32-eager", 1.02, 0.99, 1.07, "within noise"),
        _speed("tome:0.3", "tome:0.3", best, best - 0.05, best + 0.04, "faster"),
        _speed("SDPA math only", "attention:sdpa:math", 0.93, 0.90, 0.97, "slower"),
        _row(scenario="SDPA cudnn only, batch 1", metric="latency", key="attention:sdpa:cudnn",
             status="not_applicable", note="not applicable: no cuDNN kernel on a CPU"),
    ], columns=COLUMNS)


@pytest.mark.parametrize("best", [1.31, 2.47])
def test_the_speed_finding_is_written_from_the_rows(best):
    text = findings.verdict("03_attention", _rows(best))
    assert f"<b>tome:0.3</b> {best:.2f}x [{best - 0.05:.2f}-{best + 0.04:.2f}] per image over fp32 eager" \
        f" PLMS-50, faster (method: {METHOD})" in text
    assert "fastest of 2" in text  # the twin is the floor, not a contender
    assert "1 faster" in text and "1 slower" in text
    assert text.endswith("; 1 not applicable.")  # the reason is in the notebook's table, not the first screen


def test_every_finding_of_the_committed_report_is_one_short_sentence():
    """Issue 33: the first screen holds the answer and 14 findings; each cites its method by label and stays short."""
    from sdperf.core import paths
    from sdperf.store.results import read_table

    rows, _ = report.one_machine(read_table(paths.REPO_ROOT / "reports" / "cpu" / "results.csv"))
    names = sorted(rows["notebook"].dropna().unique())
    said = findings.verdicts(rows, names, findings.Legend())
    long = {n: len(v) for n, v in said.items() if len(re.sub("<[^>]+>", "", v)) > 320}
    assert len(said) == 14 and not long


def test_the_committed_pages_findings_are_the_14_notebooks_and_no_part_of_the_run(tmp_path, monkeypatch):
    """The page rebuilt from the committed rows and stamps: one finding per notebook; the rounds measured up front,
    stamped like a notebook, have their time in the summary and no "nothing measured" line among the findings."""
    import shutil

    from sdperf.core import paths

    committed = paths.REPO_ROOT / "reports" / "cpu"
    folder = tmp_path / "cpu"
    shutil.copytree(committed / "notebooks", folder / "notebooks", ignore=shutil.ignore_patterns("*.ipynb", "*.html"))
    for name in ("results.csv", "environment.json", "doctor.json"):
        shutil.copy(committed / name, folder / name)
    assert (folder / "notebooks" / "rounds-up-front.run.json").is_file()  # the part is stamped beside the notebooks
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    page = report.write_index("cpu").read_text()
    listed = re.search(r"<ul class='findings'>(.*?)</ul>", page, re.S).group(1)
    items = re.findall(r"<li><a href='#[^']*'>([^<]+)</a>", listed)
    assert len(items) == 14 and all(re.match(r"\d\d_", n) for n in items), items
    assert "rounds-up-front" not in listed and "rounds-up-front" in page  # still in the summary


def test_a_method_is_cited_by_label_and_written_once_in_the_legend():
    legend = findings.Legend()
    both = findings.verdicts(pd.concat([_rows(1.31), _rows(1.5).assign(notebook="04_torch_compile")]),
                             ["03_attention", "04_torch_compile"], legend)
    assert all("[M1]" in v and METHOD not in v for v in both.values())  # one method: one label, no text
    assert legend.texts == [METHOD] and legend.html().count(METHOD) == 1
    other = _rows(1.2).assign(notebook="09_fewer_steps", method="composed from parts")
    assert "[M2]" in findings.verdict("09_fewer_steps", other, legend) and len(legend.texts) == 2


def _judged(key: str, delta: float, half: float = 0.004) -> dict:
    """A row of sdperf.judge.techniques' table: `delta` of adherence and soft adherence, +-`half` around it."""
    return dict(key=key, label=key, guidance=7.5, status="ok", steps=50, n_images=128, adherence=0.99 + delta,
                adherence_lo=0.98 + delta, adherence_hi=1.0, adherence_delta=delta, adherence_delta_lo=delta - half,
                adherence_delta_hi=delta + half, soft_adherence_delta=delta, soft_adherence_delta_lo=delta - half,
                soft_adherence_delta_hi=delta + half, latent_mse=abs(delta), latent_mse_lo=0.0, latent_mse_hi=1.0,
                ssim=0.9, ssim_lo=0.8, ssim_hi=1.0, domain_fid=30.0, fid_delta=0.0, fid_delta_lo=-9.0,
                fid_delta_hi=9.0, fid_margin=3.0, kid=0.1, kid_delta=0.0, kid_delta_lo=-0.2, kid_delta_hi=0.2,
                kid_margin=0.01, psnr_db_median=30.0, psnr_db_p10=25.0)


def test_the_quality_finding_is_recomputed_from_the_interval_columns():
    from types import SimpleNamespace

    from sdperf.judge import controls, techniques

    class Recorder(list):
        add_many = list.extend

    table = pd.DataFrame([_judged(controls.TWIN, 0.0, 0.0), _judged(controls.noise_key(0.2), -0.2),
                          _judged("control:dpmpp-2m@4", -0.05), _judged(techniques.SEEDS_SAMPLER, -0.06),
                          _judged("tome:0.5", -0.040), _judged("int8:x", -0.009), _judged("compile:default", 0.0, 0.0)])
    study = SimpleNamespace(recorder=Recorder())
    techniques.record(study, table)
    rows = pd.DataFrame([_row(**{"notebook": "12_fid_clip", **r}) for r in study.recorder], columns=COLUMNS)
    rows["note"] = rows["note"].fillna("")  # nothing in a note decides: the verdicts come from lo and hi
    text = findings.verdict("12_fid_clip", rows)
    assert "fp32 PLMS-50, the seeds' sampler, is over budget against the converged solve" in text
    assert "controls as required" in text
    assert "3 techniques alone" in text and "1 over budget" in text and "1 within budget" in text
    assert "1 undecided" in text and "<b>tome:0.5</b> -0.040 [-0.044, -0.036]" in text
    flipped = table.copy()
    flipped.loc[flipped.key == controls.TWIN, ["adherence_delta_lo", "adherence_delta_hi"]] = (-0.05, -0.03)
    study = SimpleNamespace(recorder=Recorder())
    techniques.record(study, flipped)
    rows = pd.DataFrame([_row(**{"notebook": "12_fid_clip", **r}) for r in study.recorder], columns=COLUMNS)
    assert "controls failed (control:fp32-twin over budget): the budget cannot be trusted" in \
        findings.verdict("12_fid_clip", rows)


def test_12s_finding_states_the_controls_and_plms50_that_10_recorded():
    """10 and 12 share one measurement per run: the controls and fp32 PLMS-50 judged by 10 (recorded under 10) are
    still in 12's finding, and a stack 10's search judged is not counted as a technique alone."""
    from types import SimpleNamespace

    from sdperf.judge import controls, techniques

    class Recorder(list):
        add_many = list.extend

    def rows(notebook, judged):
        study = SimpleNamespace(recorder=Recorder())
        techniques.record(study, pd.DataFrame(judged))
        return [_row(**{"notebook": notebook, **r}) for r in study.recorder]

    ten = rows("10_ladder", [_judged(controls.TWIN, 0.0, 0.0), _judged(controls.noise_key(0.2), -0.2),
                             _judged(techniques.SEEDS_SAMPLER, -0.06),
                             _judged("deepcache:2+scheduler:euler@10", -0.07)])
    twelve = rows("12_fid_clip", [_judged("compile:default", 0.0, 0.0),
                                  _judged("compile:channels_last+freezing", 0.0, 0.0)])
    results = pd.DataFrame(ten + twelve, columns=COLUMNS)
    text = findings.verdicts(results, ["12_fid_clip"])["12_fid_clip"]
    assert "fp32 PLMS-50, the seeds' sampler, is over budget" in text and "controls as required" in text
    assert "2 techniques alone: 2 within budget" in text  # the stack is 10's; a '+' inside one key is no stack
    assert "PLMS-50" not in findings.verdict("12_fid_clip", results[results.notebook == "12_fid_clip"])


def test_a_lossless_headline_shows_plms50s_own_cost_against_the_converged_solve():
    """A lossless stack's pictures are fp32 PLMS-50's: the answer states that sampler's own judged delta (its value
    inside its interval), never a 0 beside PLMS-50's interval as 63f8373's headline row held."""
    from types import SimpleNamespace

    from sdperf.judge import techniques
    from sdperf.select import scenarios

    class Recorder(list):
        add_many = list.extend

    study = SimpleNamespace(recorder=Recorder())
    techniques.record(study, pd.DataFrame([_judged(techniques.SEEDS_SAMPLER, -0.06)]))
    judged = [_row(**{"notebook": "10_ladder", **r}) for r in study.recorder]
    key = "engine:openvino-f32"
    sc = scenarios.named(scenarios.LOSSLESS_STACK, key)
    head = [_row(notebook="10_ladder", scenario=sc, key=key, metric="seed_speedup_vs_fp32", value=1.58, lo=1.5,
                 hi=1.79, note="per image; faster"),
            _row(notebook="10_ladder", scenario=sc, key=key, metric="reference_adherence_delta", value=0.0, lo=-0.069,
                 hi=-0.025, note="trained reference model; over budget; lossless")]
    (s,) = report.headline_sentences(pd.DataFrame(judged + head, columns=COLUMNS))
    assert "fp32 PLMS-50's own" in s and "adherence -0.060 [-0.064, -0.056]" in s and "over budget" in s
    assert "+0.000" not in s and "n=128" in s
    (without,) = report.headline_sentences(pd.DataFrame(head, columns=COLUMNS))  # not judged: the row speaks
    assert "+0.000 [-0.069, -0.025]" in without


def test_a_notebook_without_comparisons_says_what_it_measured():
    rows = pd.DataFrame([_row(notebook="05_cuda_graphs", scenario="CUDA graph", metric="latency",
                              status="not_applicable", note="not applicable: needs an NVIDIA GPU")], columns=COLUMNS)
    assert findings.verdict("05_cuda_graphs", rows) == \
        "nothing measured; 1 not applicable."


def test_rows_of_another_machine_or_commit_are_refused_and_counted():
    rows = _rows(1.31).assign(time_utc="2026-11-25T10:00:00Z")  # the latest run's
    other = _rows(9.99).assign(machine="m2")
    old = _rows(7.77).assign(commit="c0")
    shown, notice = report.one_machine(pd.concat([other, rows, old], ignore_index=True))
    assert len(shown) == len(rows) and set(shown["machine"]) == {"m1"} and set(shown["commit"]) == {"c1"}
    assert "6 row(s) at commit c1 on machine m2" in notice and "6 row(s) at commit c0 on machine m1" in notice
    text = findings.verdict("03_attention", shown)
    assert "9.99" not in text and "7.77" not in text and "1.31x" in text
    assert report.one_machine(rows)[1] == ""


def test_the_first_screen_names_the_converged_reference_only_once_it_exists():
    from types import SimpleNamespace

    from sdperf.judge import controls, techniques, transfer

    class Recorder(list):
        add_many = list.extend

    table = pd.DataFrame([_judged(controls.TWIN, 0.0, 0.0), _judged("tome:0.5", -0.04),
                          dict(key="converged:dpmpp-2m@25", guidance=7.5, status="ok", steps=25, n_images=128,
                               adherence=0.99, adherence_lo=0.98, adherence_hi=1.0, domain_fid=30.0, kid=0.1)])
    study = SimpleNamespace(recorder=Recorder())
    techniques.record(study, table)
    rows = pd.DataFrame([_row(**{"notebook": "12_fid_clip", **r}) for r in study.recorder], columns=COLUMNS)
    text = transfer.sentence(rows)
    assert "judged against its converged fp32 solve (converged:dpmpp-2m@25)" in text and "may not transfer" in text
    assert transfer.sentence(_rows(1.3)) is None  # rows of the old scheme only: nothing is claimed
    t = transfer.table(techniques.overall(techniques.from_rows(rows)))
    assert list(t.key) == ["tome:0.5"] and t.transfers.iloc[0] == "may not transfer" and "tomesd" in t.published_sd15.iloc[0]


def test_the_quality_section_states_the_reference_and_both_legs_of_its_check():
    """Under 12's finding, from the convergence rows whichever notebook recorded them: the reference's solve, its
    first and last timestep, both legs' distances and shares, and the former reference against the same solve."""
    from sdperf.judge import techniques

    legs = dict(guidance=7.5, chosen=25, converged=True, fastest="euler@10", doubled=50, n_images=64,
                independent="euler@400:trailing", fastest_independent_mse=0.017, independent_first_timestep=999,
                independent_last_timestep=1)
    conv = pd.DataFrame([dict(legs, steps=25, moved_mse=5e-5, fastest_mse=0.018, share=0.003, independent_mse=1e-4,
                              independent_share=0.006, first_timestep=999, last_timestep=0)])
    former = pd.DataFrame([dict(guidance=7.5, fastest="euler@10", independent="euler@400:trailing", n_images=64,
                                key="dpmpp-2m@25", mse=3.5e-3, share=0.206, first_timestep=951, last_timestep=39)])
    rows = pd.DataFrame(techniques.convergence_rows(conv, former)).assign(notebook="10_ladder", status="ok")
    text = findings.detail("12_fid_clip", rows)
    assert text.startswith("The reference: dpmpp-2m@25:karras, t 999 -&gt; 0 at guidance 7.5, converged")
    assert "5.00e-05 (MSE), 0.3% of euler@10's distance" in text and "euler@400:trailing solve" in text
    assert "1.00e-04 from it, 0.6%" in text and "(dpmpp-2m@25, t 951 -&gt; 39) lies 3.50e-03" in text
    assert "20.6%" in text and findings.detail("09_fewer_steps", rows) is None
    failed = conv.assign(converged=False, independent_share=0.16)
    text = findings.detail("12_fid_clip", pd.DataFrame(techniques.convergence_rows(failed, None)))
    assert "NOT converged, so no stack is admitted" in text and "16.0%" in text
