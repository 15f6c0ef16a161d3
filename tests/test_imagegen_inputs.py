"""`sdperf generate` with bad input: one line on stderr naming the value and the choices, before any model is built."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from sdperf.cli import main
from sdperf.config.profiles import available_profiles


@pytest.fixture
def no_model(monkeypatch):
    """Building a pipeline fails the test: every check must come first."""
    import sdperf.imagegen.folder as folder

    def refuse(*a, **k):
        raise AssertionError("a model was built before the input was checked")

    monkeypatch.setattr(folder, "_build", refuse)


@pytest.fixture
def captions(tmp_path):
    path = tmp_path / "captions.txt"
    path.write_text("a red bicycle\ntwo dogs on a beach\n")
    return path


def _generate(*args) -> list[str]:
    return ["generate", "--profile", "smoke", "--no-progress", *args]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("sdperf: error: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize("content, suffix, problem", [
    (None, ".txt", "does not exist"),
    ("", ".txt", "is empty"),
    ("   \n\n", ".tsv", "is empty"),
    ("{not json", ".json", "is not valid JSON"),
    ("id\ttext\n1\tx\n", ".tsv", "lacks an 'id' or 'caption' column"),
    ("a caption\n", ".csv", "unknown format '.csv'"),
])
def test_bad_prompts_file_names_the_file_and_the_problem(tmp_path, capsys, no_model, content, suffix, problem):
    path = tmp_path / f"prompts{suffix}"
    if content is not None:
        path.write_text(content)
    assert main(_generate("--prompts", str(path), "--out", str(tmp_path / "out"))) == 2
    err = _error(capsys)
    assert str(path) in err and problem in err
    assert not (tmp_path / "out").exists()


def test_unknown_profile_lists_the_valid_ones(tmp_path, capsys, captions):
    assert main(["generate", "--profile", "nope", "--prompts", str(captions), "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "unknown profile 'nope'" in err and all(name in err for name in available_profiles())


@pytest.mark.parametrize("args, message", [
    (["--guidance", "7.5", "strong"], "guidance 'strong' is not valid; choose finite numbers >= 1"),
    (["--guidance", "0.5"], "guidance '0.5' is not valid"),
    (["--seeds", "x"], "seed 'x' is not valid; choose integers from 0 to 2**63-1"),
    (["--batch-size", "0"], "batch size 0 is not valid; choose an integer >= 1"),
    (["--steps", "0"], "steps 0 is not valid; choose an integer >= 1 (the profile's is 4)"),
    (["--dtype", "float8"], "dtype 'float8' is not valid; choose one of: float32, float16, bfloat16"),
    (["--num-prompts", "3"], "asked for n=3 captions but the set holds only 2"),
])
def test_bad_values_are_named_with_the_valid_choices(tmp_path, capsys, no_model, captions, args, message):
    assert main(_generate("--prompts", str(captions), "--out", str(tmp_path / "out"), *args)) == 2
    assert message in _error(capsys)


def test_out_dir_that_is_a_file_fails(tmp_path, capsys, no_model, captions):
    out = tmp_path / "taken"
    out.write_text("not a folder")
    assert main(_generate("--prompts", str(captions), "--out", str(out))) == 2
    assert f"out dir {str(out)!r} is a file, not a folder" in _error(capsys)


def test_a_folder_made_with_other_settings_is_not_resumed_into(tmp_path, capsys, no_model, captions):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"profile": "cpu", "arch": "sd15"}))
    assert main(_generate("--prompts", str(captions), "--out", str(out))) == 2
    err = _error(capsys)
    assert "profile: folder has 'cpu', this run 'smoke'" in err and "give a new --out" in err


def test_bad_prompts_file_fails_fast_in_a_fresh_process(tmp_path):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sdperf.cli", *_generate("--prompts", str(tmp_path / "no.txt"),
                                                                          "--out", str(tmp_path / "o"))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert time.perf_counter() - start < 5, "something heavy (torch) is imported before the prompts file is read"
