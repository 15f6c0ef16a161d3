"""The `sdperf` command: errors are one line on stderr with exit 2, fast; listings name every profile."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdperf.cli import main
from sdperf.config.profiles import available_profiles


def test_unknown_profile_is_one_line_exit_2(capsys):
    assert main(["run", "--profile", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sdperf: error: unknown profile 'nope'")
    assert "Traceback" not in err
    for name in available_profiles():
        assert name in err


def test_unknown_only_name_is_one_line_exit_2(capsys):
    assert main(["run", "--profile", "smoke", "--only", "no_such_notebook"]) == 2
    err = capsys.readouterr().err
    assert "sdperf: error: unknown notebook 'no_such_notebook'; valid notebooks:" in err


def _commands() -> list[list[str]]:
    commands = [[sys.executable, "-m", "sdperf.cli"]]
    script = Path(sys.executable).with_name("sdperf")
    if script.is_file():  # the installed console script, when this venv has one
        commands.append([str(script)])
    return commands


@pytest.mark.parametrize("command", _commands(), ids=lambda c: Path(c[-1]).name)
def test_bad_profile_fails_within_seconds_in_a_fresh_process(command):
    start = time.perf_counter()
    proc = subprocess.run([*command, "run", "--profile", "nope"], capture_output=True, text=True, timeout=30)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2
    assert "valid profiles:" in proc.stderr and "smoke" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 5, f"took {elapsed:.1f}s: something heavy is imported before the profile is checked"


def test_profiles_lists_every_profile_and_auto(capsys, monkeypatch):
    monkeypatch.setenv("SDPERF_PROFILE", "smoke")  # skip GPU detection: keeps this test free of torch
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name in available_profiles():
        assert any(line.split()[:1] == [name] for line in lines), name
    assert "scheduler" in lines[0] and "batch_sizes" in lines[0]
    assert "'auto' resolves to 'smoke' here: $SDPERF_PROFILE is set" in out


def test_env_prints_the_record_as_json(capsys):
    assert main(["env", "--profile", "smoke"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["profile"] == "smoke" and record["device"] == "cpu"
    assert "torch" in record["packages"]


def test_report_writes_index_into_the_reports_dir(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path))
    assert main(["report", "--profile", "smoke"]) == 0
    index = tmp_path / "smoke" / "index.html"
    assert capsys.readouterr().out.strip() == str(index)
    page = index.read_text()
    assert "sdperf study: profile smoke" in page and "No notebook has run" in page


def test_profiles_shows_a_broken_profile_and_lists_the_others(capsys, monkeypatch, tmp_path):
    import shutil

    from sdperf.core import paths

    params = tmp_path / "params"
    shutil.copytree(paths.REPO_ROOT / "params", params)
    (params / "broken.yml").write_text((params / "smoke.yml").read_text()
                                       .replace("guidance_scale: 7.5", 'guidance_scale: "high"'))
    (params / "badsection.yml").write_text((params / "smoke.yml").read_text()
                                           .replace("n_images: 4", "n_images: many"))
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(params))
    monkeypatch.setenv("SDPERF_PROFILE", "smoke")
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "guidance_scale must be a finite number" in out and "n_images" in out
    for name in ("smoke", "cpu", "sd15-a10g"):
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name


def test_an_empty_profile_name_at_the_cli_is_one_line_exit_2(capsys):
    assert main(["run", "--profile", ""]) == 2
    err = capsys.readouterr().err
    assert "is empty; valid profiles:" in err and "Traceback" not in err
