"""The runner and report against throwaway notebooks: real kernels, real papermill, a temp reports folder."""
from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest

from sdperf.core import environment, paths
from sdperf.report import report
from sdperf.run import plan, runner
from sdperf.core.errors import ConfigError
from sdperf.store import stamps
from sdperf.store.results import Recorder

CLEAN_SHA = "0123456789ab"
# A 1x1 PNG: the report only has to embed it, not decode it.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
                       "RU5ErkJggg==")


def make_notebook(path: Path, code_cells: list[str]) -> Path:
    """A study-shaped notebook: a title, one `parameters` cell, then the given code."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    params = nbformat.v4.new_code_cell('profile = "auto"  # str: a profile in params/')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# test"), params] + [nbformat.v4.new_code_cell(c) for c in code_cells]
    nbformat.write(nb, str(path))
    return path


def marker_code(marker: Path) -> str:
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text(profile)"


def run_quiet(*args, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = runner.run(*args, **kwargs)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One run of a good and a failing notebook, shared by the tests that only read its outputs."""
    root = tmp_path_factory.mktemp("study")
    nbdir = root / "notebooks"
    nbdir.mkdir()
    marker = root / "good.marker"
    make_notebook(nbdir / "00_good.ipynb", [marker_code(marker)])
    # code cells: parameters (index 1), `x = 1` (index 2), the raise (index 3) in the source notebook
    make_notebook(nbdir / "01_bad.ipynb", ["x = 1", "raise ValueError('boom\\nsecond line')"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDPERF_REPORTS_DIR", str(root / "reports"))
        mp.setattr(environment, "git_commit", lambda *a, **k: CLEAN_SHA)
        wrapper = root / "reports" / "smoke" / ".scratch" / "inductor" / "an-earlier-run" / "wrapper.py"
        wrapper.parent.mkdir(parents=True)
        wrapper.write_text("print('ran')")  # a cached wrapper inductor would run: it must not outlive its run
        code, out = run_quiet("smoke", notebooks_dir=nbdir)
        yield {"root": root, "nbdir": nbdir, "marker": marker, "code": code, "out": out,
               "reports": root / "reports" / "smoke", "mp": mp}


def test_inductors_cache_goes_with_the_run(study):
    assert not (study["reports"] / ".scratch" / "inductor").exists()


def test_good_notebook_runs_with_profile_parameter(study):
    executed = study["reports"] / "notebooks" / "00_good.ipynb"
    assert study["marker"].read_text() == "smoke"  # papermill injected profile="smoke" over "auto"
    nb = nbformat.read(str(executed), as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert (study["reports"] / "notebooks" / "00_good.html").stat().st_size > 1000
    assert json.loads((study["reports"] / "environment.json").read_text())["profile"] == "smoke"
    stamp = json.loads((study["reports"] / "notebooks" / "00_good.run.json").read_text())
    assert stamp["status"] == "ok" and stamp["commit"] == CLEAN_SHA and stamp["duration_s"] > 0
    assert stamp["notebook_sha256"] == stamps.sha256_file(study["nbdir"] / "00_good.ipynb")
    assert not list((study["reports"] / "notebooks").glob(".*")), "a temp notebook was left behind"


def test_failing_notebook_is_named_with_its_cell_and_fails_the_run(study):
    assert study["code"] == 1
    assert "FAILED 01_bad: cell 3 (ValueError: boom)" in study["out"]
    out = study["reports"] / "notebooks"
    assert (out / "01_bad.failed.ipynb").is_file() and (out / "01_bad.failed.html").is_file()
    assert not (out / "01_bad.ipynb").exists()
    stamp = json.loads((out / "01_bad.run.json").read_text())
    assert stamp["status"] == "failed"
    assert stamp["error"] == {"cell_index": 3, "exec_count": 4, "ename": "ValueError", "evalue": "boom"}
    summary = study["out"].splitlines()
    assert any(line.split()[:2] == ["00_good", "ok"] for line in summary)
    assert any(line.split()[:2] == ["01_bad", "failed"] for line in summary)


def test_run_writes_index_flagging_the_failure(study):
    page = (study["reports"] / "index.html").read_text()
    assert "Study summary" in page and "01_bad" in page
    assert "cell 3 (ValueError: boom)" in page
    assert "href='notebooks/01_bad.failed.ipynb'" in page


def test_second_run_skips_and_force_reruns(study):
    study["marker"].unlink(missing_ok=True)
    code, out = run_quiet("smoke", only=["good"], notebooks_dir=study["nbdir"])
    assert code == 0
    assert f"skipped 00_good: already run for commit {CLEAN_SHA}" in out
    assert not study["marker"].exists()

    code, out = run_quiet("smoke", only=["00"], force=True, notebooks_dir=study["nbdir"])
    assert code == 0 and "skipped" not in out
    assert study["marker"].read_text() == "smoke"


def test_dirty_tree_never_skips(study):
    study["marker"].unlink(missing_ok=True)
    study["mp"].setattr(environment, "git_commit", lambda *a, **k: CLEAN_SHA + "-dirty")
    try:
        code, out = run_quiet("smoke", only=["00_good"], notebooks_dir=study["nbdir"])
    finally:
        study["mp"].setattr(environment, "git_commit", lambda *a, **k: CLEAN_SHA)
    assert code == 0 and "skipped" not in out
    assert study["marker"].exists()


@pytest.mark.parametrize("change, expected", [
    ({}, True),
    ({"commit": CLEAN_SHA + "-dirty"}, False),
    ({"commit": "unknown"}, False),
    ({"notebook_sha256": "edited"}, False),
    ({"profile_sha256": "edited"}, False),
    ({"profile": "other"}, False),
])
def test_should_skip_needs_everything_unchanged(change, expected):
    stamp = {"commit": CLEAN_SHA, "profile": "smoke", "notebook_sha256": "a", "profile_sha256": "b", "status": "ok"}
    current = {k: stamp[k] for k in ("commit", "profile", "notebook_sha256", "profile_sha256")} | change
    assert stamps.should_skip(stamp, current) is expected
    assert stamps.should_skip(stamp | {"status": "failed"}, current) is False


def test_only_accepts_full_name_number_or_topic():
    names = ["00_baseline", "01_half_precision", "02_compile"]
    assert plan.select(["half_precision", "00", "02_compile", "00_baseline"], names) == names
    assert plan.select(None, names) == names
    with pytest.raises(ConfigError, match="valid notebooks: 00_baseline, 01_half_precision, 02_compile"):
        plan.select(["nope"], names)


def test_unknown_profile_fails_fast_naming_valid_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"unknown profile 'nope'.*smoke"):
        runner.run("nope", notebooks_dir=tmp_path)
    assert time.perf_counter() - start < 3
    assert not any(tmp_path.iterdir()), "nothing may be written before validation passes"


def test_unknown_only_name_fails_fast_listing_notebooks(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    make_notebook(tmp_path / "00_good.ipynb", ["pass"])
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"unknown notebook 'nope'; valid notebooks: 00_good"):
        runner.run("smoke", only=["nope"], notebooks_dir=tmp_path)
    assert time.perf_counter() - start < 3
    assert not (tmp_path / "reports").exists()


def test_timeout_is_reported_at_the_hung_cell(tmp_path, monkeypatch):
    params = tmp_path / "params"
    params.mkdir()
    smoke = (paths.REPO_ROOT / "params" / "smoke.yml").read_text()
    (params / "smoke.yml").write_text(re.sub(r"cell_timeout_s:\s*\d+", "cell_timeout_s: 2", smoke))
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(params))
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    make_notebook(tmp_path / "00_hang.ipynb", ["import time\ntime.sleep(60)", "print('never')"])
    code, out = run_quiet("smoke", notebooks_dir=tmp_path)
    assert code == 1
    assert "FAILED 00_hang: cell 2 (CellTimeoutError:" in out
    assert (tmp_path / "reports" / "smoke" / "notebooks" / "00_hang.failed.ipynb").is_file()


def test_a_killed_kernel_says_which_signal_ended_it_in_the_failure_and_the_summary(tmp_path, monkeypatch):
    """A kernel ended by SIGKILL (what the OOM killer sends) is not just 'Kernel died': the FAILED line, the stamp
    and the run's summary name the signal, and memory as the likely cause unless the system says otherwise."""
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    make_notebook(tmp_path / "00_killed.ipynb", ["import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"])
    code, out = run_quiet("smoke", notebooks_dir=tmp_path)
    assert code == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("FAILED 00_killed"))
    assert "cell 2 (DeadKernelError:" in line and "ended by signal 9 (SIGKILL); out of memory" in line
    summary = out[out.index("notebook"):]
    assert "failed" in summary and "signal 9 (SIGKILL)" in summary
    stamp = stamps.read_stamp("smoke", "00_killed")
    assert stamp["error"]["kernel_exit"].startswith("signal 9 (SIGKILL)")


def test_a_kernel_that_exits_by_itself_is_not_suspected_of_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    make_notebook(tmp_path / "00_exits.ipynb", ["import os\nos._exit(3)"])
    code, out = run_quiet("smoke", notebooks_dir=tmp_path)
    line = next(ln for ln in out.splitlines() if ln.startswith("FAILED 00_exits"))
    assert code == 1 and "ended by exit code 3" in line and "memory" not in line


def test_index_shows_results_figures_and_links(study):
    reports = study["reports"]
    env = json.loads((reports / "environment.json").read_text())
    rec = Recorder("00_good", "smoke", env)
    rec.add("unet", "latency", 0.123456789, "s", p10=0.1111111, p90=0.13333333, n=5, method="a test row")
    rec.not_applicable("onnx", "needs <onnxruntime> & a GPU")
    rec.failed("compile", RuntimeError("inductor broke"))
    figures = paths.figures_dir("smoke")
    figures.mkdir(parents=True, exist_ok=True)
    (figures / "00_good__latency.png").write_bytes(PNG)
    (figures / "00_good__latency.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    (figures / "99_other__latency.png").write_bytes(PNG)

    page = report.write_index("smoke").read_text()

    assert ">0.1235<" in page and ">0.1111<" in page and ">0.1333<" in page
    assert "not applicable: needs &lt;onnxruntime&gt; &amp; a GPU" in page  # escaped, shown in place of a number
    assert 'class="data row1 col2 not_applicable"' in page
    assert "RuntimeError: inductor broke" in page and "col2 failed" in page
    assert "<img src='figures/00_good__latency.png'" in page
    assert "href='figures/00_good__latency.svg'" in page
    assert "99_other" not in page
    assert "href='notebooks/00_good.ipynb'" in page and "href='notebooks/00_good.html'" in page
    assert "ISA flags present" in page and env["cpu_model"] in page
    offline = re.sub(r"<a href='https?://[^'\s]+'>", "", page)  # sources are links to follow, never loaded
    assert "http://" not in offline and "https://" not in offline and "<script" not in page


def test_a_profiles_notebook_parameters_reach_the_notebook_and_a_typo_fails_before_anything_runs(tmp_path,
                                                                                                 monkeypatch):
    import yaml

    params = tmp_path / "params"
    params.mkdir()
    smoke = yaml.safe_load((paths.REPO_ROOT / "params" / "smoke.yml").read_text())
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(params))
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setattr(environment, "git_commit", lambda *a, **k: CLEAN_SHA)
    nbdir, marker = tmp_path / "notebooks", tmp_path / "variants.marker"
    nbdir.mkdir()
    path = make_notebook(nbdir / "09_fewer_steps.ipynb",
                         [f"from pathlib import Path\nPath({str(marker)!r}).write_text(repr(variants))"])
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[1].source += '\nvariants = ["scheduler:plms@25"]  # list: catalog keys'
    nbformat.write(nb, str(path))

    def profile(notebooks: dict) -> str:
        (params / "p.yml").write_text(yaml.safe_dump(dict(smoke, notebooks=notebooks)))
        return "p"

    run_quiet(profile({"09_fewer_steps": {"variants": ["scheduler:euler@20"]}}), notebooks_dir=nbdir)
    assert marker.read_text() == "['scheduler:euler@20']"  # the profile's value, over the notebook's default
    marker.unlink()
    for notebooks, message in (({"09_fewer_steps": {"variantz": []}}, r"09_fewer_steps has no parameter "
                                                                        r"'variantz'; valid parameters: variants"),
                               ({"99_nope": {}}, r"unknown notebook '99_nope'; valid notebooks: 00_baseline"),
                               ({"09_fewer_steps": ["x"]}, "must be a mapping")):
        with pytest.raises(ConfigError, match=message):
            runner.run(profile(notebooks), notebooks_dir=nbdir, force=True)
        assert not marker.exists()


# ---------------------------------------------------------------- a killed run never passes for a finished one

ROWS_CELL = """import os, time
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sdperf.core import environment
from sdperf.store import figure_captions, plots
from sdperf.store.results import Recorder
env = environment.record(profile, "cpu")
rec = Recorder("00_rows", profile, env)
rec.add("engine", "latency", float(os.environ["ROW_VALUE"]), "s", method='a test row')
fig, ax = plt.subplots()
ax.set_title(os.environ["ROW_VALUE"])
caption = figure_captions.Caption(what="a test bar", device=figure_captions.device_text(env),
                                  baseline=figure_captions.NO_BASELINE, method="a row written by hand",
                                  n="value " + os.environ["ROW_VALUE"])
plots.save_figure(fig, profile, "00_rows", "bars", caption)
Path(os.environ["ROW_MARKER"]).write_text("rows written")
time.sleep(float(os.environ["ROW_SLEEP"]))"""

DRIVER = """import sys
from sdperf.core import environment
from sdperf.run import runner
environment.git_commit = lambda *a, **k: {sha!r}
sys.exit(runner.run("smoke", notebooks_dir={nbdir!r}, force=True))
"""


def test_a_killed_force_rerun_leaves_the_previous_results_and_the_next_run_redoes_it(tmp_path, monkeypatch):
    """Kill `sdperf run --force` (SIGKILL, driver and kernel) after the notebook wrote its new row and figure: the
    previous row, figure, stamp and executed notebook stand; the report calls the rerun interrupted; the next plain
    run reruns the notebook, cleans the killed run's files, and only then do the new row and figure replace them."""
    import signal
    import subprocess
    import sys

    import pandas as pd

    reports = tmp_path / "reports"
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    make_notebook(nbdir / "00_rows.ipynb", [ROWS_CELL])
    marker = tmp_path / "rows.marker"
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(reports))
    monkeypatch.setattr(environment, "git_commit", lambda *a, **k: CLEAN_SHA)
    monkeypatch.setenv("ROW_MARKER", str(marker))
    monkeypatch.setenv("ROW_SLEEP", "0")
    monkeypatch.setenv("ROW_VALUE", "1.0")
    assert run_quiet("smoke", notebooks_dir=nbdir)[0] == 0
    folder = reports / "smoke"
    stamp_before = (folder / "notebooks" / "00_rows.run.json").read_text()
    figure = folder / "figures" / "00_rows__bars.svg"
    figure_before = figure.read_bytes()
    caption = folder / "figures" / "00_rows__bars.caption.json"
    assert json.loads(caption.read_text())["n"] == "value 1.0"

    marker.unlink()
    env = dict(os.environ, ROW_VALUE="2.0", ROW_SLEEP="120")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(sha=CLEAN_SHA, nbdir=str(nbdir))], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert marker.exists(), "the forced rerun never reached its row"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    rows = pd.read_csv(folder / "results.csv")
    assert rows[rows.notebook == "00_rows"].value.tolist() == [1.0]  # the killed run's 2.0 is not current
    assert (folder / "notebooks" / "00_rows.run.json").read_text() == stamp_before
    assert (folder / "notebooks" / "00_rows.ipynb").is_file()
    assert figure.read_bytes() == figure_before
    assert json.loads(caption.read_text())["n"] == "value 1.0"  # the caption stays with its figure
    assert list((folder / ".staging").rglob("*.csv")), "the killed run's staged row is where the next run finds it"
    stamps = report.read_stamps("smoke")
    assert stamps["00_rows"]["status"] == "ok" and "was interrupted" in report.interrupted_text(stamps["00_rows"])

    monkeypatch.setenv("ROW_VALUE", "3.0")
    code, out = run_quiet("smoke", notebooks_dir=nbdir)  # no --force: the interrupted rerun is redone
    assert code == 0 and "skipped" not in out
    rows = pd.read_csv(folder / "results.csv")
    assert rows[rows.notebook == "00_rows"].value.tolist() == [3.0]
    assert figure.read_bytes() != figure_before
    assert json.loads(caption.read_text())["n"] == "value 3.0"  # promoted with the figure
    assert not (folder / "notebooks" / "00_rows.running.json").exists()
    assert not any((folder / ".staging").iterdir()) if (folder / ".staging").exists() else True
    assert not [p.name for p in (folder / "notebooks").iterdir() if p.name.startswith(".")]
    assert "interrupted" not in report.read_stamps("smoke")["00_rows"]


def test_a_second_run_of_one_profile_fails_at_once_naming_the_first(tmp_path, monkeypatch):
    from sdperf.store import staging

    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    make_notebook(tmp_path / "00_good.ipynb", ["pass"])
    with staging.run_lock("smoke", "run-1"):
        assert staging.running_run("smoke") == "run-1"
        with pytest.raises(ConfigError, match=r"another `sdperf run --profile smoke` is running \(pid \d+ run run-1"):
            runner.run("smoke", notebooks_dir=tmp_path)
    assert staging.running_run("smoke") is None


def test_leftover_temp_files_of_a_dead_run_are_removed_and_fresh_ones_kept(tmp_path, monkeypatch):
    from sdperf.store import staging

    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    folder = tmp_path / "reports" / "smoke"
    (folder / "notebooks").mkdir(parents=True)
    (folder / ".staging" / "run-1" / "figures").mkdir(parents=True)
    (folder / ".staging" / "run-1" / "00_x.csv").write_text("notebook\n")
    (folder / "figures").mkdir()
    partial = folder / "notebooks" / ".00_x.abc123.ipynb"  # only a run writes here: removed at any age
    old = folder / "figures" / ".00_x__bars.png.ghi789.tmp"
    fresh = [folder / ".results.csv.def456.tmp", folder / "figures" / ".00_x__bars.svg.jkl012.tmp"]
    keep = [folder / "results.csv", folder / "results.csv.lock", folder / "notebooks" / "00_x.ipynb",
            folder / "notebooks" / "00_x.run.json", folder / "figures" / "00_x__bars.png"]
    for path in [partial, old, *fresh, *keep]:
        path.write_text("x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    removed = staging.clean_leftovers("smoke")
    assert sorted(removed) == [".staging/run-1", "figures/.00_x__bars.png.ghi789.tmp", "notebooks/.00_x.abc123.ipynb"]
    assert all(p.exists() for p in fresh + keep)  # a temp file that young may be a notebook's live write


def test_a_run_keys_its_rounds_by_commit_machine_and_profile_and_clears_the_others(smoke, tmp_path, monkeypatch):
    """Two runs of one commit, machine and profile share a ledger key (the second resumes the first's rounds);
    another key's rounds are removed, and --force removes this key's too."""
    from sdperf.measure import ledger as ledgers
    from sdperf.core import paths
    from sdperf.run import runner

    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    monkeypatch.delenv(ledgers.KEY_ENV, raising=False)
    key = runner.resume_rounds(smoke, force=False)
    assert key == runner.resume_rounds(smoke, force=False) and key.startswith("resumable-")
    assert ledgers.run_key() == key
    folder = paths.scratch_dir(smoke.name) / "rounds"
    mine, other = folder / f"{key}-smoke-abc", folder / "resumable-0123456789abcdef-smoke-abc"
    for d in (mine, other):
        d.mkdir(parents=True)
    runner.resume_rounds(smoke, force=False)
    assert mine.is_dir() and not other.exists()
    runner.resume_rounds(smoke, force=True)
    assert not mine.exists()
    parts = ledgers.resume_parts("a", "m", "steps: 2\n")
    for other_parts in (dict(parts, commit="b"), dict(parts, machine="n"), ledgers.resume_parts("a", "m", "steps: 3\n")):
        assert ledgers.resume_key(other_parts) != ledgers.resume_key(parts)
    # a comment, the description or the expected times may change; a setting may not
    same = ledgers.resume_parts("a", "m", "description: other\nsteps: 2  # why\nexpected: {rounds_per_worker_s: 9}\n")
    assert ledgers.resume_key(same) == ledgers.resume_key(parts)


def test_a_resumed_run_under_other_threads_starts_clean_and_says_why(smoke, tmp_path, monkeypatch, capsys):
    """Issue 61: a run killed after round 0 and resumed with OMP_NUM_THREADS=1 must not keep round 0 measured at 2
    threads beside rounds at 1; the discarded rounds are announced with what changed."""
    from sdperf.core import paths
    from sdperf.run import runner

    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    first = runner.resume_rounds(smoke, force=False, say=lambda _: None)
    finished = paths.scratch_dir(smoke.name) / "rounds" / f"{first}-smoke-abc"
    finished.mkdir()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    said = []
    second = runner.resume_rounds(smoke, force=False, say=said.append)
    assert second != first and not finished.exists()
    assert len(said) == 1 and "other threads (OMP_NUM_THREADS 2 -> 1)" in said[0] and first in said[0]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert runner.resume_rounds(smoke, force=False, say=said.append) == first  # the same settings: the same key


def test_a_skipped_notebook_whose_html_is_older_than_its_run_gets_fresh_html(tmp_path, monkeypatch):
    """A study killed before its HTML step leaves the notebooks it finished beside an earlier run's HTML; the
    resumed run skips them, and must still export their pages again, while an HTML newer than its run stays."""
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    out = runner.outputs_dir("smoke")
    out.mkdir(parents=True)
    stale, fresh = (make_notebook(out / f"{n}.ipynb", ["1"]) for n in ("00_stale", "01_fresh"))
    for nb, age in ((stale, 100), (fresh, -100)):  # the earlier run's page is older (newer) than the executed copy
        html = nb.with_suffix(".html")
        html.write_text("an earlier run's page")
        t = nb.stat().st_mtime - age
        os.utime(html, (t, t))
    said = []
    assert runner.convert("smoke", [runner.Outcome("00_stale", runner.SKIPPED),
                                    runner.Outcome("01_fresh", runner.SKIPPED)], said.append) and not said
    assert "<html" in stale.with_suffix(".html").read_text()
    assert fresh.with_suffix(".html").read_text() == "an earlier run's page"
