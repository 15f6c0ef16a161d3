"""The results table: tidy rows, replace-on-rerun, environment columns, and no half-written file ever."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from sdperf.core import environment
from sdperf.store import results
from sdperf.store.results import COLUMNS, Recorder, read_results, results_path
from sdperf.measure.timing import Timing

pytestmark = pytest.mark.usefixtures("scratch_reports")


@pytest.fixture(scope="module")
def env():
    return environment.record("smoke", "cpu")


def test_environment_record_has_what_a_reader_needs(env):
    for key in ("device", "device_name", "cpu_model", "cpu_isa", "threads", "python", "packages", "commit",
                "time_utc"):
        assert key in env
    assert env["packages"]["torch"].startswith("2.14.1")
    assert env["threads"] >= 1


def test_timing_rows_and_replace_on_rerun(env):
    rec = Recorder("00_test", "smoke", env)
    rec.timing("fp32, batch 1", Timing([1.0, 2.0, 3.0], 5.0, 2**30, "peak RSS"), method="a test row")
    df = rec.table()
    assert list(df.columns) == COLUMNS
    latency = df[df.metric == "latency"].iloc[0]
    assert (latency.value, latency.p10, latency.p90, latency.n) == (2.0, pytest.approx(1.2), pytest.approx(2.8), 3)
    assert df[df.metric == "latency_first_call"].value.iloc[0] == 5.0
    assert df[df.metric == "peak_memory"].value.iloc[0] == 1024.0
    assert (df.commit == env["commit"]).all() and (df.profile == "smoke").all()
    rec.timing("fp32, batch 1", Timing([4.0], 4.0), method="a test row")  # a rerun replaces, never duplicates
    df = rec.table()
    assert df[df.metric == "latency"].value.tolist() == [4.0]
    assert len(df[df.metric == "peak_memory"]) == 1  # untouched row of the same scenario stays


def test_timing_rows_carry_the_method_they_are_given(env):
    rec = Recorder("00_test", "smoke", env)
    rec.timing("loop, plms", Timing([1.0, 2.0], 3.0, 2**20, "peak RSS"), metric="loop_latency", method="in turn")
    df = rec.table().set_index("metric")
    assert df.loc[["loop_latency", "loop_latency_first_call", "peak_memory"], "method"].tolist() == ["in turn"] * 3


def test_a_staged_run_replaces_all_its_rows_only_when_promoted(env, monkeypatch):
    """Under `sdperf run` a notebook's rows wait in staging: results.csv keeps its previous rows (a killed run
    changes nothing), the notebook reads its own new rows, and promotion drops scenarios it no longer produces."""
    from sdperf.store import staging

    old = Recorder("00_prune", "smoke", env)
    old.add("engine A, batch 1", "latency", 1.0, "s", method="a test row")
    old.add("engine B, batch 1", "latency", 2.0, "s", method="a test row")
    Recorder("00_other", "smoke", env).add("x", "latency", 3.0, "s", method="a test row")
    monkeypatch.setenv(staging.STAGE_ENV, "00_prune")
    new = Recorder("00_prune", "smoke", {**env, "run_id": "run-2"})
    new.add("engine B, batch 1", "latency", 2.5, "s", method="a test row")
    kept = read_results("smoke")
    assert sorted(kept[kept.notebook == "00_prune"].value) == [1.0, 2.0]  # nothing current until it completes
    assert new.table()[["scenario", "value"]].values.tolist() == [["engine B, batch 1", 2.5]]
    assert sorted(new.current().notebook) == ["00_other", "00_prune"]  # the others' rows are still seen
    monkeypatch.delenv(staging.STAGE_ENV)
    assert results.promote_rows("smoke", "00_prune", staging.rows_path("smoke", "00_prune", "run-2")) == 1
    left = read_results("smoke")
    assert left[left.notebook == "00_prune"][["scenario", "value"]].values.tolist() == [["engine B, batch 1", 2.5]]
    assert left[left.notebook == "00_other"].value.tolist() == [3.0]  # other notebooks' rows are not touched
    assert not staging.rows_path("smoke", "00_prune", "run-2").exists()


def test_non_measured_rows_carry_reason_not_number(env):
    rec = Recorder("05_test", "smoke", env)
    rec.not_applicable("CUDA graphs", "needs an NVIDIA GPU")
    rec.failed("openvino backend", IndexError("guard"))
    rec.skipped("fp16 whole generation", "over budget")
    df = rec.table().set_index("status")
    assert math.isnan(df.loc["not_applicable", "value"]) and df.loc["not_applicable", "note"].startswith("not applicable:")
    assert df.loc["failed", "note"] == "IndexError: guard"
    assert df.loc["skipped", "note"].startswith("skipped:")


def test_verdict_and_batch_size_are_columns(env):
    """A compared row stores its speed verdict and batch as data; a row not measured carries its status as its
    verdict; a word outside the vocabulary is refused before anything is written."""
    rec = Recorder("03_test", "smoke", env)
    rec.add("tome:0.3, batch 2", "speedup_vs_fp32", 1.3, "x", key="tome:0.3", batch_size=2, verdict=results.FASTER,
            method="a test row")
    rec.not_applicable("SDPA cudnn only, batch 1", "no cuDNN kernel on a CPU", batch_size=1)
    with pytest.raises(ValueError, match="verdict 'quick' is not valid"):
        rec.add("x", "speedup_vs_fp32", 1.3, "x", verdict="quick")
    df = read_results("smoke").set_index("status")
    assert df.loc["ok", "verdict"] == "faster" and df.loc["ok", "batch_size"] == 2
    assert df.loc["not_applicable", "verdict"] == "not applicable" and df.loc["not_applicable", "batch_size"] == 1
    assert results_path("smoke").read_text().splitlines()[1].count(",2,faster,") == 1  # written whole, not 2.0


def test_rows_written_before_the_columns_get_them_on_read(env):
    """The committed reports/cpu rows have no verdict or batch_size column: both are derived when such a table is
    read (from the note and the scenario, in that one place), and the next write stores them."""
    old = [c for c in COLUMNS if c not in ("verdict", "batch_size")]
    row = Recorder("03_test", "smoke", env)._row("x", "latency", 1.0, "s", method="a test row")
    rows = [dict(row, scenario="tome:0.3, batch 4", metric="seed_speedup_vs_fp32", unit="x", value=1.3,
                 note="per image at 50 PLMS steps; faster (noise band 0.943-1.061x)"),
            dict(row, scenario="best admissible stack: tome:0.3", metric="seed_speedup_vs_fp32", unit="x", value=1.3,
                 note="per image at the stack's steps over fp32 eager PLMS 50; within noise"),
            dict(row, scenario="math is faster there, batch 1", metric="host_share", unit="", value=0.1,
                 note="on a GPU the same seconds are a larger share (math is faster there)"),
            dict(row, scenario="fp16, batch 1", metric="latency", status="skipped", value=None, unit="",
                 note="skipped: over budget")]
    path = results_path("smoke")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pd.DataFrame(rows, columns=old).to_csv(index=False))
    df = read_results("smoke")
    assert list(df.columns) == COLUMNS
    assert df["verdict"].tolist()[:2] == ["faster", "within noise"] and pd.isna(df["verdict"].iloc[2])
    assert df["verdict"].iloc[3] == "skipped"
    assert df["batch_size"].tolist()[0] == 4 and pd.isna(df["batch_size"].iloc[1])
    Recorder("03_test", "smoke", env).add("y", "latency", 2.0, "s", method="a test row")
    header = path.read_text().splitlines()[0].split(",")
    assert "verdict" in header and read_results("smoke")["verdict"].tolist()[0] == "faster"


def test_ok_row_needs_a_value(env):
    with pytest.raises(ValueError, match="needs a measured value"):
        Recorder("x", "smoke", env).add("s", "latency", None, "s")
    with pytest.raises(ValueError, match="status"):
        Recorder("x", "smoke", env).add("s", "latency", 1.0, "s", status="great")


def test_a_measured_row_needs_its_method_and_a_row_not_measured_does_not(env):
    rec = Recorder("x", "smoke", env)
    for method in ("", "  ", None):
        with pytest.raises(ValueError, match="s/latency: an 'ok' row needs a method"):
            rec.add("s", "latency", 1.0, "s", method=method)
    with pytest.raises(ValueError, match="needs a method"):
        rec.timing("t", Timing([1.0], 1.0))
    rec.not_applicable("n", "no GPU")
    rec.add("s", "latency", 1.0, "s", method="one call, perf_counter")
    assert rec.table().set_index("scenario")["method"].fillna("").to_dict() == {"n": "", "s": "one call, perf_counter"}


def test_failed_replace_leaves_old_file_and_no_temp(env, monkeypatch):
    rec = Recorder("00_test", "smoke", env)
    rec.add("a", "latency", 1.0, "s", method="a test row")
    before = results_path("smoke").read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(results.os, "replace", boom)
    with pytest.raises(OSError):
        rec.add("b", "latency", 2.0, "s", method="a test row")
    assert results_path("smoke").read_bytes() == before
    assert [p.name for p in results_path("smoke").parent.iterdir() if p.name.endswith(".tmp")] == []


def test_killed_writer_never_leaves_a_broken_table(scratch_reports):
    """SIGKILL a process in the middle of a stream of writes: the table always parses with whole rows."""
    code = textwrap.dedent("""
        from sdperf.store.results import upsert_rows, results_path, COLUMNS, NUMERIC
        i = 0
        while True:
            upsert_rows(results_path("smoke"), [dict({c: 1.0 if c in NUMERIC else "x" * 50 for c in COLUMNS},
                                                     scenario=f"s{i}", value=i)])
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    path = results_path("smoke")
    deadline = time.time() + 60
    while (not path.exists() or len(read_results("smoke")) < 20) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    df = pd.read_csv(path)
    assert len(df) >= 20
    assert df.notna().all().all()  # every row complete
    assert df["value"].tolist() == list(range(len(df)))
