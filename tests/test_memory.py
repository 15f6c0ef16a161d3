"""The memory preflight (sdperf.measure.memory, issue 32): a configuration whose estimated peak exceeds the memory available
is a skipped row naming both, decided before any worker starts; estimates come without building anything."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from sdperf.core import environment
from sdperf.measure import doctor, memory, rounds
from sdperf.config.architectures import PUBLISHED_PARAMETERS
from sdperf.core.errors import ConfigError
from sdperf.optimizations.catalog import BASELINE_KEY
from sdperf.store.results import COLUMNS, results_path, upsert_rows
from sdperf.measure.rounds import Config

REPO = Path(__file__).resolve().parents[1]


def _no_launch(spec, **_kw):
    raise AssertionError(f"a worker was launched for {spec['stack']} at batch {spec['batch_size']}")


def _cap_below(monkeypatch, profile, key=BASELINE_KEY, batch=1) -> int:
    """Set SDPERF_MEMORY_CAP_MIB one MiB under the configuration's estimate; returns the cap."""
    cap = math.floor(memory.estimate(profile, key, batch).mib) - 1
    monkeypatch.setenv(memory.CAP_ENV, str(cap))
    return cap


def test_cap_below_the_tiny_estimate_skips_00s_workers_naming_both(smoke, monkeypatch):
    est = memory.estimate(smoke, BASELINE_KEY, 1)
    cap = _cap_below(monkeypatch, smoke)
    raw = rounds.alone(smoke, [Config("fp32 eager, batch 1", BASELINE_KEY, 1)], rounds=1, launcher=_no_launch,
                       say=lambda _: None)
    assert raw.status.tolist() == ["skipped"]
    note = raw.note.iloc[0]
    assert f"{est.mib:,.0f} MiB" in note and f"{cap:,} MiB available" in note and memory.CAP_ENV in note


def test_cap_below_the_baseline_skips_every_comparison_without_a_worker(smoke, monkeypatch):
    _cap_below(monkeypatch, smoke)
    m = rounds.run(smoke, [Config.of("grad:no_grad")], rounds=3, launcher=_no_launch, say=lambda _: None)
    status = m.summary.set_index("config").status
    assert status.to_dict() == {rounds.BASELINE: "skipped", "grad:no_grad": "skipped"}
    notes = m.summary.set_index("config").note
    assert all("estimated peak" in n and "exceeds" in n for n in notes)


def test_a_configuration_over_the_cap_is_skipped_while_the_baseline_runs(smoke, monkeypatch):
    """engine:* holds two more copies of the UNet, so a cap between the two estimates refuses only the engine."""
    base = memory.estimate(smoke, BASELINE_KEY, 1).mib
    engine = memory.estimate(smoke, "engine:onnxruntime-fp32", 1).mib
    assert engine > base + 1
    monkeypatch.setenv(memory.CAP_ENV, str(math.ceil(base)))
    launched = []

    def fake(spec, **_kw):
        launched.append(spec["stack"])
        return {"status": "failed", "note": "not measured in this test"}, None

    gone = rounds.run(smoke, [Config.of("engine:onnxruntime-fp32")], rounds=3, launcher=fake, say=lambda _: None)
    row = gone.summary.set_index("config").loc["engine:onnxruntime-fp32"]
    if row.status == "not_applicable":
        pytest.skip(f"the engine cannot run here at all: {row.note}")
    assert row.status == "skipped" and f"{engine:,.0f} MiB" in row.note
    assert "engine:onnxruntime-fp32" not in launched and BASELINE_KEY in launched


def test_sdxl_estimate_at_a_tiny_resolution_without_building(smoke, monkeypatch):
    from sdperf.model import pipelines

    def refuse(*_a, **_k):
        raise AssertionError("the estimate built a pipeline")

    monkeypatch.setattr(pipelines, "build_random", refuse)
    monkeypatch.setattr(pipelines, "build_pipeline", refuse)
    xl = dataclasses.replace(smoke, name="sdxl-tiny-res", arch="sdxl", resolution=64)
    est = memory.formula(xl, BASELINE_KEY, 1)
    assert est.parts["weights"] == 4 * sum(PUBLISHED_PARAMETERS["sdxl"].values())
    assert est.bytes == sum(est.parts.values()) > est.parts["weights"]
    bigger = memory.formula(dataclasses.replace(xl, resolution=256), BASELINE_KEY, 2)
    assert bigger.parts["activations"] > est.parts["activations"]
    assert bigger.parts["weights"] == est.parts["weights"]


def test_meta_device_count_equals_the_built_tiny_networks(tiny_pipe):
    from sdperf.model.pipelines import component_parameters

    assert memory.parameter_counts("tiny") == component_parameters(tiny_pipe)


def test_formula_is_near_the_committed_cpu_baselines_measured_peak():
    """The cpu report's fp32 eager workers (SD 1.5, 256 px) measured their process peak: the formula must land
    within 15% of it, or the preflight refuses what runs (or passes what dies)."""
    from sdperf.config.profiles import load_profile

    df = pd.read_csv(REPO / "reports" / "cpu" / "results.csv")
    rows = df[(df.metric == "process_peak_memory") & (df.key == BASELINE_KEY)
              & df.scenario.str.endswith(", batch 1")]
    assert len(rows)
    measured = rows.value.median()
    est = memory.formula(load_profile("cpu", check_runtime=False), BASELINE_KEY, 1).mib
    assert 0.85 < est / measured < 1.15, (est, measured)


def _peak_row(profile, mib: float, **kw) -> dict:
    """A measured process peak of the baseline at batch 1 on this machine, commit and setting."""
    row = dict.fromkeys(COLUMNS)
    row.update(notebook="00_baseline", scenario="fp32 eager, batch 1", batch_size=1, metric="process_peak_memory",
               value=mib, unit="MiB", key=BASELINE_KEY, machine=environment.fingerprint(profile.device),
               profile=profile.name, setting=profile.setting, status="ok", device=profile.device,
               commit=environment.git_commit(), time_utc="2026-11-26T00:00:00Z")  # every field results.REQUIRED asks
    return {**row, **kw}


def test_earlier_rows_at_the_same_setting_machine_and_commit_replace_the_formula(smoke, scratch_reports):
    formula = memory.formula(smoke, BASELINE_KEY, 1).mib
    near = round(formula * 1.2, 2)
    upsert_rows(results_path(smoke.name), [_peak_row(smoke, near),
                                           _peak_row(smoke, formula * 1.4, notebook="01_half_precision",
                                                     machine="another-machine")])
    est = memory.estimate(smoke, BASELINE_KEY, 1)
    assert est.mib == pytest.approx(near) and "results.csv" in est.basis
    upsert_rows(results_path(smoke.name), [_peak_row(smoke, near, hi=near + 10)])  # over rounds: the largest worker
    assert memory.estimate(smoke, BASELINE_KEY, 1).mib == pytest.approx(near + 10)
    assert memory.estimate(smoke, BASELINE_KEY, 2).basis.startswith("formula")


@pytest.mark.parametrize("other", [{"setting": "sd15 512px, guidance 7.5, random weights, cpu"},
                                   {"commit": "0123456789ab"}, {"setting": None}, {"status": "failed"}])
def test_a_peak_measured_under_other_settings_or_code_is_not_used(smoke, scratch_reports, other):
    """A 64 px run's peak once passed the same profile at 512 px (issue 61): the setting and commit must match."""
    upsert_rows(results_path(smoke.name), [_peak_row(smoke, memory.formula(smoke, BASELINE_KEY, 1).mib, **other)])
    assert memory.estimate(smoke, BASELINE_KEY, 1).basis.startswith("formula")


def test_the_latest_peak_counts_and_an_outlier_moves_the_formula_only_within_its_band(smoke, scratch_reports):
    """The largest peak ever recorded once won for good, so one 25,000 MiB row skipped the baseline, and with it
    every comparison, in every later run."""
    formula = memory.formula(smoke, BASELINE_KEY, 1)
    path = results_path(smoke.name)
    upsert_rows(path, [_peak_row(smoke, 25_000.0)])
    est = memory.estimate(smoke, BASELINE_KEY, 1)
    assert est.bytes == int(memory.TRUSTED_BAND[1] * formula.bytes) and "held to" in est.basis
    assert est.parts["measured"] == 25_000 * memory.MIB  # the measurement is still shown
    upsert_rows(path, [_peak_row(smoke, 1.0, scenario="fp32 eager, batch 1 (again)", time_utc="2026-11-27T00:00:00Z")])
    low = memory.estimate(smoke, BASELINE_KEY, 1)  # the later row counts, and cannot lower the formula past the band
    assert low.bytes == int(memory.TRUSTED_BAND[0] * formula.bytes) and "held to" in low.basis


def test_a_bad_cap_names_the_value(monkeypatch):
    monkeypatch.setenv(memory.CAP_ENV, "12GB")
    with pytest.raises(ConfigError, match="'12GB'.*positive whole number of MiB"):
        memory.available()


def test_cap_and_meminfo_set_what_is_available(monkeypatch, tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemAvailable:    2048 kB\n")
    assert memory.meminfo_available(info) == 2048 * 1024
    monkeypatch.setenv(memory.CAP_ENV, "3")
    room = memory.available()
    assert room.bytes == 3 * 2**20 and memory.CAP_ENV in room.source


def test_doctor_shows_each_rungs_estimate_and_refuses_over_the_cap(smoke, monkeypatch):
    key = "grad:no_grad"
    rows = {r["rung"]: r for r in doctor.rungs(smoke)}
    assert rows[key]["peak_estimate_mib"] == round(memory.estimate(smoke, key, 1).mib)
    assert rows[key]["verdict"] == doctor.WILL_RUN
    _cap_below(monkeypatch, smoke, key)
    capped = {r["rung"]: r for r in doctor.rungs(smoke)}
    assert capped[key]["verdict"] == doctor.WONT_RUN
    assert "estimated peak" in capped[key]["reason"] and memory.CAP_ENV in capped[key]["reason"]
    lines = doctor.machine_lines(smoke)
    assert any("memory available" in line for line in lines)
    base = next(line for line in lines if line.startswith("fp32 eager baseline workers"))
    assert all(f"batch {b}: skipped: not enough memory" in base for b in smoke.batch_sizes)


def test_a_bad_cap_fails_sdperf_run_before_any_notebook(monkeypatch):
    from sdperf.run import runner

    monkeypatch.setenv(memory.CAP_ENV, "-5")
    with pytest.raises(ConfigError, match=r"SDPERF_MEMORY_CAP_MIB='-5' is not valid"):
        runner.validate("smoke", ["00"])


def test_a_kernels_own_pipeline_over_the_cap_is_refused_before_it_is_built(smoke, monkeypatch):
    from sdperf.measure import study as studies

    def refuse(*_a, **_k):
        raise AssertionError("the pipeline was built")

    monkeypatch.setattr(studies, "build_pipeline", refuse)
    st = studies.Study(notebook="00_baseline", profile=smoke, env={}, recorder=None)
    cap = _cap_below(monkeypatch, st.profile)
    with pytest.raises(memory.NotEnoughMemory, match=rf"building the tiny pipeline in this kernel \(00_baseline\): "
                                                     rf"not enough memory .*estimated peak .* exceeds the {cap:,} MiB"):
        st.pipeline("float32")
