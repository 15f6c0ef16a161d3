"""Nothing may change a published number or a user's files unnoticed (issue 61): a clean-up never reaches through a
link or out of reports/<P>/, a ledger's damaged lines are skipped or ended and never counted twice, and a compiler
cache that runs as code never outlives its run."""
from __future__ import annotations

import json
import warnings

import pytest

from sdperf.core import paths
from sdperf.core.errors import ConfigError


@pytest.fixture
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    root = tmp_path / "reports" / "smoke"
    root.mkdir(parents=True)
    return root


@pytest.fixture
def elsewhere(tmp_path):
    """A folder of the user's outside the reports folder, with files sdperf would have removed."""
    other = tmp_path / "thesis"
    (other / "run-1").mkdir(parents=True)
    (other / "run-1" / "00_x.csv").write_text("precious")
    (other / "1234.json").write_text(json.dumps({"processes": {}}))
    (other / ".notes.tex.tmp").write_text("precious")
    (other / "thesis.tex").write_text("precious")
    return other


def _intact(other):
    return sorted(p.relative_to(other).as_posix() for p in other.rglob("*") if p.is_file()) == \
        [".notes.tex.tmp", "1234.json", "run-1/00_x.csv", "thesis.tex"]


def test_a_symlinked_staging_folder_is_refused_and_nothing_behind_it_is_removed(reports, elsewhere):
    from sdperf.store import staging

    (reports / staging.STAGING).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"\.staging.* is a symbolic link.*nothing was removed"):
        staging.clean_leftovers("smoke")
    assert _intact(elsewhere)
    staging.remove_run("smoke", "run-1")
    assert _intact(elsewhere)


def test_a_symlinked_notebooks_folder_loses_no_temp_file(reports, elsewhere):
    from sdperf.store import staging

    (reports / "notebooks").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match="notebooks"):
        staging.clean_leftovers("smoke")
    assert _intact(elsewhere)


def test_staging_clean_up_removes_run_folders_and_links_as_links(reports, elsewhere):
    from sdperf.store import staging

    stage = reports / staging.STAGING
    (stage / "run-2").mkdir(parents=True)
    (stage / "run-2" / "00_x.csv").write_text("left by a killed run")
    (stage / "linked").symlink_to(elsewhere, target_is_directory=True)
    removed = staging.clean_leftovers("smoke")
    assert sorted(removed) == [".staging/linked", ".staging/run-2"] and not any(stage.iterdir())
    assert _intact(elsewhere)


def test_a_symlinked_workers_folder_is_refused_and_its_records_stay(reports, elsewhere):
    from sdperf.measure import lifeline
    from sdperf.run import runner

    lifeline.folder("smoke").symlink_to(elsewhere, target_is_directory=True)
    assert lifeline.survivors("smoke") == [] and _intact(elsewhere)
    with pytest.raises(ConfigError, match=r"\.workers.* is a symbolic link"):
        runner.check_survivors("smoke")
    assert _intact(elsewhere)


@pytest.mark.parametrize("content", ["[]", "42", '{"processes": {"worker": {"pid": "x"}}}', "{", '{"a": 1}'])
def test_a_malformed_pid_file_is_removed_without_a_traceback(reports, content):
    from sdperf.measure import lifeline

    folder = lifeline.folder("smoke")
    folder.mkdir()
    (folder / "99.json").write_text(content)
    (folder / "notes.json").write_text("[]")  # not a name registered() writes: left alone
    assert lifeline.survivors("smoke") == []
    assert not (folder / "99.json").exists() and (folder / "notes.json").exists()


def test_the_engine_trim_evicts_only_its_own_artefacts_and_nothing_through_a_link(reports, tmp_path, monkeypatch):
    from sdperf.optimizations import artefacts

    monkeypatch.setenv("SDPERF_RUN_ID", "run-1")
    root = artefacts.shared_root(paths.scratch_dir("smoke"))

    def build(folder):
        (folder / "blob").write_bytes(b"x" * 1000)
        return {}

    for key in ("openvino-ir-00000000000000aa", "openvino-ir-00000000000000bb"):
        artefacts.cached(root, key, build)
    foreign = root / "thesis"  # a user's folder that happens to hold an artefact.json
    foreign.mkdir()
    (foreign / artefacts.DONE).write_text("{}")
    (foreign / "thesis.tex").write_text("precious" * 500)
    assert sorted(artefacts.trim(root, 0)) == ["openvino-ir-00000000000000aa", "openvino-ir-00000000000000bb"]
    assert (foreign / "thesis.tex").is_file()
    moved = tmp_path / "other-disk"  # the cache moved to another disk and linked back: no trim through the link
    moved.mkdir()
    artefacts.cached(moved, "onnx-00000000000000cc", build)
    root.rename(tmp_path / "old-shared")
    root.symlink_to(moved, target_is_directory=True)
    with pytest.warns(UserWarning, match="symbolic link"):
        assert artefacts.trim(root, 0) == []
    assert (moved / "onnx-00000000000000cc" / "blob").is_file()


def test_a_torn_ledger_line_is_ended_before_the_next_record(tmp_path):
    from sdperf.measure.ledger import Ledger

    book = Ledger(tmp_path, sitting="s1")
    book.append({"role": "config", "stack": "a", "batch_size": 1, "round": 0, "status": "ok"})
    with open(tmp_path / "records.jsonl", "a") as fh:
        fh.write('{"role": "config", "stack": "cut')  # a writer killed mid-line
    book.append({"role": "config", "stack": "b", "batch_size": 1, "round": 0, "status": "ok"})
    assert [r["stack"] for r in book.records()] == ["a", "b"]  # before: the torn line swallowed b's record


@pytest.mark.parametrize("line", ["[]", "42", '"text"', '{"role": "config", "stack": "a"}',
                                  '{"role": "burn", "stack": "a", "batch_size": 1, "round": 0, "status": "ok"}'])
def test_a_ledger_line_that_is_not_a_record_is_skipped_with_a_warning(tmp_path, line):
    from sdperf.measure.ledger import Ledger

    book = Ledger(tmp_path, sitting="s1")
    book.append({"role": "config", "stack": "a", "batch_size": 1, "round": 0, "status": "ok"})
    with open(tmp_path / "records.jsonl", "a") as fh:
        fh.write(line + "\n")
    with pytest.warns(UserWarning, match="line\\(s\\) 2 are not ledger records"):
        recs = book.records()
    assert [r["stack"] for r in recs] == ["a"]


def test_a_duplicated_or_foreign_record_is_not_counted(tmp_path):
    from sdperf.measure.ledger import Ledger

    book = Ledger(tmp_path, sitting="s1")
    rec = {"role": "config", "stack": "a", "batch_size": 1, "round": 0, "status": "ok", "unet_step_s": 1.0}
    book.append(rec)
    with open(tmp_path / "records.jsonl", "a") as fh:
        fh.write(json.dumps({**rec, "sitting": "s1", "unet_step_s": 0.1}) + "\n")  # the same round again
        fh.write(json.dumps({**rec, "stack": "b", "sitting": "elsewhere"}) + "\n")  # a sitting that never wrote here
    with pytest.warns(UserWarning, match="line\\(s\\) 3"):
        recs = book.records()
    assert [(r["stack"], r["unet_step_s"]) for r in recs] == [("a", 1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Ledger(tmp_path / "clean", sitting="s2").records()  # an empty ledger warns of nothing


def test_each_run_compiles_into_an_inductor_cache_of_its_own(tmp_path, monkeypatch):
    """Inductor runs the Python wrappers it caches: a cache shared across runs ran a line appended to it."""
    from sdperf.optimizations import torch_compile

    monkeypatch.setenv("SDPERF_RUN_ID", "run-1")
    first = torch_compile.inductor_dir(tmp_path)
    monkeypatch.setenv("SDPERF_RUN_ID", "run-2")
    assert torch_compile.inductor_dir(tmp_path) != first and first.parent == tmp_path / "inductor"


# ---------------------------------------------------------------- the smaller ones: a clear refusal, never a traceback

@pytest.mark.parametrize("stamp", [{"duration_s": -5.0, "workers": 10}, {"duration_s": 100.0, "workers": -3},
                                   {"duration_s": 100.0, "workers": "abc"}, {"duration_s": "1e9", "workers": 3},
                                   {"duration_s": float("inf"), "workers": 3}])
def test_a_malformed_eta_stamp_is_no_figure_not_a_traceback_or_a_negative_time(tmp_path, stamp):
    from sdperf.run import eta

    path = tmp_path / "rounds.json"
    path.write_text(json.dumps({"status": "ok", "machine": "m", **stamp}))
    r = eta.rounds(path, 20, "m")
    assert r.seconds is None or r.seconds >= 0
    assert eta.notebook(path, "00", "m").seconds in (None, 100.0)


def test_a_huge_measured_on_is_said_short(tmp_path):
    from sdperf.run import eta

    guess = {"measured_on": "x" * 500_000, "notebooks_s": {"a": 10.0}, "rounds_per_worker_s": "fast"}
    a = eta.notebook(tmp_path / "none.json", "a", "m", "", guess)
    assert a.seconds == 10.0 and len(a.source) < 300
    assert eta.rounds(tmp_path / "none.json", 5, "m", "", guess).seconds is None  # text is no figure


@pytest.mark.parametrize("raw", ["inf", "1e309", "-1", "abc", "nan"])
def test_a_bad_engine_cache_size_fails_before_anything_runs(monkeypatch, raw):
    from sdperf.optimizations import artefacts
    from sdperf.run import runner

    monkeypatch.setenv(artefacts.CACHE_ENV, raw)
    with pytest.raises(ConfigError, match=rf"{artefacts.CACHE_ENV}="):
        runner.validate("smoke", ["00"])


def test_a_superscript_memory_cap_is_refused_by_name(monkeypatch):
    from sdperf.measure import memory

    monkeypatch.setenv(memory.CAP_ENV, "²")  # str.isdigit() says yes, int() says no
    with pytest.raises(ConfigError, match=r"SDPERF_MEMORY_CAP_MIB='²' is not valid"):
        memory.cap_bytes()


@pytest.mark.parametrize("value", ["grad:nograd", ["grad:inference_mode", "schedular:euler@10"], "engine:nope-f32"])
def test_an_unknown_catalog_key_in_a_profile_fails_before_the_first_notebook(tmp_path, monkeypatch, value):
    """It once failed only in the notebook's seventh cell."""
    import dataclasses

    from sdperf.config.profiles import load_profile
    from sdperf.run.plan import check_notebook_parameters

    profile = dataclasses.replace(load_profile("smoke", check_runtime=False),
                                  notebooks={"02_inference_mode": {"variants": value if isinstance(value, list)
                                                                   else [value]}})
    with pytest.raises(ConfigError, match=r"notebooks: 02_inference_mode: variants: .*technique"):
        check_notebook_parameters(profile, ["02_inference_mode"])
    fine = dataclasses.replace(profile, notebooks={"02_inference_mode": {"variants": ["grad:no_grad"]},
                                                   "03_attention": {"probe_dtypes": ["float32"]}})
    check_notebook_parameters(fine, ["02_inference_mode", "03_attention"])  # keys valid, other lists untouched


def test_a_row_whose_value_is_text_names_its_line(scratch_reports):
    from sdperf.store.results import COLUMNS, DamagedTable, read_results, results_path, upsert_rows

    row = dict.fromkeys(COLUMNS)
    row.update(notebook="00", scenario="s", metric="latency", value=1.0, unit="s", status="ok", profile="smoke",
               device="cpu", machine="m", commit="c", time_utc="2026-12-01T00:00:00Z")
    upsert_rows(results_path("smoke"), [row])
    path = results_path("smoke")
    path.write_text(path.read_text().replace(",1.0,s,", ",fast,s,"))
    with pytest.raises(DamagedTable, match=r"line 2: the row's value is 'fast', not a number"):
        read_results("smoke")


def test_a_manifest_part_row_naming_another_file_or_a_cut_png_is_not_an_image(tmp_path):
    import numpy as np

    from sdperf.imagegen import store
    from sdperf.imagegen.keys import ImageKey

    key = ImageKey(7.5, "p1", 3)
    store.write_image(tmp_path, key, np.zeros((8, 8, 3), np.uint8))
    other = ImageKey(7.5, "p2", 4)
    store.write_image(tmp_path, other, np.zeros((8, 8, 3), np.uint8))
    base = {c: "" for c in store.COLUMNS}
    rows = [dict(base, key=key.name, prompt_id="p1", caption="c", guidance=7.5, seed=3, file=key.relpath,
                 time_utc="2026-12-01T00:00:00Z"),
            dict(base, key=other.name, prompt_id="p2", caption="c", guidance=7.5, seed=4, file="/etc/passwd",
                 time_utc="2026-12-01T00:00:01Z")]
    (tmp_path / store.PARTS_DIR).mkdir(exist_ok=True)
    (tmp_path / store.PARTS_DIR / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = store.rebuild_manifest(tmp_path)
    assert list(table.file) == [key.relpath]  # the row naming /etc/passwd is not one of the folder's images
    png = tmp_path / key.relpath
    png.write_bytes(png.read_bytes()[:-20])  # cut short after it was written whole
    assert store.existing(tmp_path, [key, other]) == {other} and not png.exists()  # generated again


def test_a_program_that_is_not_chromium_is_a_clear_refusal(tmp_path, monkeypatch):
    pytest.importorskip("playwright")
    from sdperf.report import report_check

    page = tmp_path / "index.html"
    page.write_text("<html><body>x</body></html>")
    monkeypatch.setenv(report_check.CHROMIUM_ENV, "/bin/true")
    with pytest.raises(report_check.BrowserMissing, match="did not start as a headless Chromium"):
        report_check.check_page(page)


@pytest.mark.parametrize("command", [["report"], ["doctor", "--record"], ["run", "--only", "00"]])
def test_a_reports_folder_that_is_a_file_is_a_clear_error_for_every_command(tmp_path, monkeypatch, capsys, command):
    from sdperf import cli

    afile = tmp_path / "reports"
    afile.write_text("not a folder")
    monkeypatch.setenv(paths.REPORTS_ENV, str(afile))
    assert cli.main([command[0], "--profile", "smoke", *command[1:]]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and afile.read_text() == "not a folder"
