"""Inputs built to hurt (issue 32): relative or empty folders in the environment, damaged results tables, YAML
alias bombs and runaway nesting, FIFOs and path-like names in params/. Each fails fast with a clear error that names
the file, line or variable, or is handled right; none reaches a model, a kernel or a traceback."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from sdperf.core import environment, paths
from sdperf.run import plan, runner
from sdperf.cli import main
from sdperf.core.errors import ConfigError, short
from sdperf.config.profiles import available_profiles, load_profile, read_yaml
from sdperf.store.results import COLUMNS, DamagedTable, Recorder, check_results, read_results, results_path

SMOKE_TEXT = (paths.REPO_ROOT / "params" / "smoke.yml").read_text()


def _without_section(text: str, key: str) -> str:
    """The profile text without one top-level section (its key line and the indented lines under it)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(f"{key}:"):
            skipping = True
        elif skipping and line.strip() and not line.startswith((" ", "#")):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)
CLEAN_SHA = "0123456789ab"


def _params(tmp_path: Path, monkeypatch, files: dict[str, str]) -> Path:
    folder = tmp_path / "params"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(folder))
    return folder


# ---------------------------------------------------------------- folders named in the environment

def test_relative_folders_become_absolute_once_and_children_inherit_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SDPERF_REPORTS_DIR", "relrep")
    monkeypatch.setenv("SDPERF_PARAMS_DIR", "sub/../relparams")
    paths.resolve_env()
    assert os.environ["SDPERF_REPORTS_DIR"] == str(tmp_path / "relrep")
    assert os.environ["SDPERF_PARAMS_DIR"] == str(tmp_path / "relparams")
    monkeypatch.chdir("/")  # a process started elsewhere (the kernel: the repo root) sees the same folders
    assert paths.reports_root() == tmp_path / "relrep" and paths.params_dir() == tmp_path / "relparams"


@pytest.mark.parametrize("var", ["SDPERF_REPORTS_DIR", "SDPERF_PARAMS_DIR"])
def test_an_empty_folder_variable_is_an_error_naming_it(tmp_path, monkeypatch, capsys, var):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, "")
    assert main(["report", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert f"${var} is set but empty" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir()), "nothing may be written into the current folder"


def test_a_run_with_relative_folders_promotes_its_rows_and_measures_the_validated_profile(tmp_path, monkeypatch):
    """The kernel starts in the repo root; with relative $SDPERF_REPORTS_DIR and $SDPERF_PARAMS_DIR it must still
    write where the runner promotes from, and read the profile the runner validated."""
    from test_runner import make_notebook, run_quiet

    work = tmp_path / "cwd"
    (work / "relparams").mkdir(parents=True)
    (work / "relparams" / "smoke.yml").write_text(SMOKE_TEXT.replace("prompt:", "prompt: 'the relative one' #", 1))
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    make_notebook(nbdir / "00_rel.ipynb", [
        "from sdperf.core import environment\nfrom sdperf.config.profiles import load_profile\n"
        "from sdperf.store.results import Recorder\n"
        "Recorder('00_rel', profile, environment.record(profile, 'cpu')).add(load_profile(profile).prompt, "
        "'latency', 1.5, 's', method='a test row')"])
    monkeypatch.chdir(work)
    monkeypatch.setenv("SDPERF_REPORTS_DIR", "relrep")
    monkeypatch.setenv("SDPERF_PARAMS_DIR", "relparams")
    monkeypatch.setattr(environment, "git_commit", lambda *a, **k: CLEAN_SHA)
    code, out = run_quiet("smoke", notebooks_dir=nbdir)
    assert code == 0, out
    rows = read_results("smoke")
    assert rows[["notebook", "scenario", "value"]].values.tolist() == [["00_rel", "the relative one", 1.5]]
    assert results_path("smoke") == work / "relrep" / "smoke" / "results.csv"
    assert not (paths.REPO_ROOT / "relrep").exists() and not list((work / "relrep" / "smoke").glob(".staging/*/*"))


# ---------------------------------------------------------------- a damaged results.csv

@pytest.fixture
def table(scratch_reports):
    """A good two-row results.csv of profile smoke, and its lines."""
    env = {"device": "cpu", "device_name": "cpu", "cpu_model": "x", "machine": "m1", "threads": 2, "commit": "c1",
           "run_id": "r1", "packages": {"torch": "2"}, "python": "3.11", "time_utc": "2026-01-01T00:00:00Z"}
    rec = Recorder("00_baseline", "smoke", env)
    rec.add("a", "latency", 1.0, "s", method="a test row")
    rec.add("b", "latency", 2.0, "s", method="a test row")
    path = results_path("smoke")
    return path, path.read_text().splitlines(keepends=True)


def _short_row(lines):
    """The last row without its last fields (time_utc among them): it once won 'the latest run'."""
    return "".join(lines[:-1]) + ",".join(lines[-1].split(",")[:10]) + "\n", 3


DAMAGE = {
    "torn last line": (lambda lines: "".join(lines)[:-25], 3, "torn"),
    "short row": (lambda lines: _short_row(lines)[0], 3, "has 10 field"),
    "extra field": (lambda lines: "".join(lines[:2]) + lines[2].rstrip("\n") + ",surplus\n", 3,
                    f"has {len(COLUMNS) + 1} field"),
    "empty": (lambda lines: "", 1, "empty"),
    "binary": (lambda lines: "".join(lines[:2]) + "\x00\x01\x02garbage\n", 3, "binary"),
    "no time_utc": (lambda lines: "".join(lines[:2]) + lines[2].rstrip("\n").rsplit(",", 1)[0] + ",\n", 3,
                    "no time_utc"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_results_table_is_an_error_naming_file_and_line(table, kind):
    path, lines = table
    damage, line, what = DAMAGE[kind]
    path.write_bytes(damage(lines).encode("utf-8", "surrogateescape"))
    with pytest.raises(DamagedTable) as err:
        read_results("smoke")
    msg = str(err.value)
    assert str(path) in msg and f"line {line}:" in msg and what in msg, msg


def test_a_damaged_results_table_fails_the_run_before_anything_is_measured(table, monkeypatch, capsys):
    path, lines = table
    path.write_text("".join(lines)[:-25])
    monkeypatch.setattr(runner, "_run_locked", lambda *a: pytest.fail("the run started on a damaged table"))
    start = time.perf_counter()
    assert main(["run", "--profile", "smoke", "--only", "00", "--force"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - start < 5
    assert f"{str(path)!r} is damaged at line 3" in err and "Traceback" not in err


def test_a_whole_table_reads_and_a_row_without_its_environment_is_never_written(table):
    path, _ = table
    check_results("smoke")
    assert read_results("smoke").scenario.tolist() == ["a", "b"]
    env = {"device": "cpu", "device_name": "cpu", "cpu_model": "x", "machine": None, "threads": 2, "commit": "c1",
           "packages": {}, "python": "3.11", "time_utc": "2026-01-01T00:00:00Z"}
    with pytest.raises(ValueError, match="a row needs machine"):
        Recorder("00_baseline", "smoke", env).add("c", "latency", 1.0, "s", method="a test row")
    assert read_results("smoke").scenario.tolist() == ["a", "b"]


# ---------------------------------------------------------------- YAML alias bombs and runaway nesting

def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_profile_is_refused_in_well_under_a_second(tmp_path, monkeypatch):
    text = SMOKE_TEXT + "notes: *a8\n" + _alias_bomb()
    _params(tmp_path, monkeypatch, {"bomb.yml": text})
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"anchors and aliases .* are not allowed") as err:
        load_profile("bomb", check_runtime=False)
    assert time.perf_counter() - start < 1 and len(str(err.value)) < 2000


def test_runaway_nesting_is_a_clear_error_not_a_recursion_error(tmp_path, monkeypatch):
    _params(tmp_path, monkeypatch, {"deep.yml": SMOKE_TEXT + "notes: " + "[" * 50_000 + "]" * 50_000 + "\n"})
    with pytest.raises(ConfigError, match=r"nested more than 20 levels"):
        load_profile("deep", check_runtime=False)


def test_a_bomb_or_a_fifo_in_params_does_not_hang_the_profile_list(tmp_path, monkeypatch, capsys):
    folder = _params(tmp_path, monkeypatch, {"smoke.yml": SMOKE_TEXT, "bomb.yml": SMOKE_TEXT + "notes: *a8\n" +
                                             _alias_bomb()})
    os.mkfifo(folder / "named_pipe.yml")
    (folder / "....yml").write_text(SMOKE_TEXT)  # stem '...': a name that is a path, not a profile
    start = time.perf_counter()
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert time.perf_counter() - start < 10
    assert "named_pipe" not in available_profiles() and "named_pipe" not in out
    assert "anchors and aliases" in out and "profile name '...' is not valid" in out
    with pytest.raises(OSError, match="not a regular file"):
        read_yaml(folder / "named_pipe.yml")


def test_a_path_like_profile_name_never_becomes_a_reports_folder(tmp_path, monkeypatch, capsys):
    _params(tmp_path, monkeypatch, {"...yml": SMOKE_TEXT})
    assert ".." in available_profiles()
    assert main(["report", "--profile", ".."]) == 2
    assert "profile name '..' is not valid" in capsys.readouterr().err


NOTEBOOK_PARAMS = """
notebooks:
  10_ladder:
    allocators: {value}
"""


@pytest.mark.parametrize("value, message", [
    ("*a8\n" + _alias_bomb(), "anchors and aliases"),
    ("[" * 30 + "]" * 30, "nested more than 20 levels"),
    ("[[allocator:jemalloc]]", "must be a list of at most 1000 strings or numbers"),
    ("{allocator: jemalloc}", "must be list .*got dict"),
    ("yes", "must be list .*got bool True"),
])
def test_a_hostile_notebook_parameter_fails_validation(tmp_path, monkeypatch, value, message):
    text = _without_section(SMOKE_TEXT, "notebooks") + NOTEBOOK_PARAMS.format(value=value)
    _params(tmp_path, monkeypatch, {"smoke.yml": text})
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=message) as err:
        runner.validate("smoke", ["10"])
    assert time.perf_counter() - start < 5 and len(str(err.value)) < 2000


def test_notebook_parameters_of_the_annotated_types_pass(tmp_path, monkeypatch):
    plan.check_parameter_type("x", ["a", 1, 2.5], "list")
    plan.check_parameter_type("x", 3, "float")
    plan.check_parameter_type("x", True, "bool")
    with pytest.raises(ConfigError, match=r"x must be float .*got bool"):
        plan.check_parameter_type("x", True, "float")
    with pytest.raises(ConfigError, match=r"x must be str .*got int 5"):
        plan.check_parameter_type("x", 5, "str")


def test_short_bounds_what_a_message_shows_of_a_huge_value():
    bomb = yaml.load(_alias_bomb(), Loader=yaml.SafeLoader)  # the plain loader expands it: 9**9 strings
    start = time.perf_counter()
    text = short(bomb)
    assert time.perf_counter() - start < 0.1 and len(text) <= 200 and text.startswith("{'a0'")


# ---------------------------------------------------------------- a manifest must cover its folder

@pytest.fixture
def model_copy(tmp_path):
    """A copy of the committed reference model, free to tamper with."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(paths.REPO_ROOT / "models" / "reference", folder)
    return folder


def _rewrite(folder: Path, files: dict) -> None:
    import json

    data = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(dict(data, files=files)))


def _listed(folder: Path) -> dict:
    import json

    return json.loads((folder / "manifest.json").read_text())["files"]


def test_the_committed_model_covers_its_folder(model_copy):
    from sdperf.refmodel import manifest

    assert manifest.verify(model_copy)["files"] == manifest.write_files(model_copy)


def test_an_empty_file_list_verifies_nothing_so_a_tampered_unet_never_loads(model_copy):
    from sdperf.model.pipelines import build_from_weights
    from sdperf.refmodel import storage

    unet = model_copy / "unet" / "diffusion_pytorch_model.safetensors"
    unet.write_bytes(unet.read_bytes()[:-8] + b"tampered")
    with pytest.raises(ConfigError, match="changed .*unet/diffusion_pytorch_model.safetensors"):
        storage.verify(model_copy)
    _rewrite(model_copy, {})
    for check in (storage.verify, lambda f: build_from_weights(str(f), "plms")):  # `weights:` folders too
        with pytest.raises(ConfigError, match="lists no files, so it verifies nothing"):
            check(model_copy)


@pytest.mark.parametrize("entry", ["../../../../etc/passwd", "/etc/passwd", "unet/../../outside.txt", "link.txt"])
def test_a_manifest_entry_outside_the_folder_is_refused_without_reading_it(model_copy, monkeypatch, entry):
    from sdperf.refmodel import manifest

    (model_copy.parent / "outside.txt").write_text("secret")
    (model_copy / "link.txt").symlink_to(model_copy.parent / "outside.txt")
    listed = dict(_listed(model_copy), **{entry: manifest.sha256(model_copy.parent / "outside.txt")})
    if entry != "link.txt":
        listed["link.txt"] = listed[entry]
    _rewrite(model_copy, listed)
    read = []
    monkeypatch.setattr(manifest, "sha256", lambda p: read.append(p) or "0")
    with pytest.raises(ConfigError, match="outside the folder") as err:
        manifest.verify(model_copy)
    assert entry in str(err.value) and read == []


def test_an_unlisted_file_in_the_folder_is_refused(model_copy):
    from sdperf.refmodel import storage

    (model_copy / "unet" / "diffusion_pytorch_model.bin").write_bytes(b"a second set of weights, never hashed")
    with pytest.raises(ConfigError, match=r"does not list: \['unet/diffusion_pytorch_model.bin'\]"):
        storage.verify(model_copy)


# ---------------------------------------------------------------- train-reference never replaces another model

def test_quick_training_never_lands_on_a_model_of_another_recipe(tmp_path, monkeypatch, capsys):
    import json

    from sdperf.refmodel import storage, train_command
    from sdperf.refmodel.training_recipe import QUICK, Recipe

    ran = []
    monkeypatch.setattr(train_command, "run", lambda recipe, target, **kw: ran.append((recipe, Path(target))))
    committed = tmp_path / "reference"
    committed.mkdir()
    (committed / "manifest.json").write_text(json.dumps({"recipe": Recipe(seed=0).to_dict(), "files": {}}))
    before = (committed / "manifest.json").read_bytes()
    assert main(["train-reference", "--quick", "--out", str(committed), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "holds a model made by another recipe" in err and "--force" in err and "unet_steps" in err
    assert ran == [] and (committed / "manifest.json").read_bytes() == before

    assert main(["train-reference", "--out", str(committed), "--no-progress"]) == 0  # its own recipe: a rebuild
    assert main(["train-reference", "--quick", "--out", str(committed), "--force", "--no-progress"]) == 0
    assert [(r == QUICK, t) for r, t in ran] == [(False, committed), (True, committed)]

    ran.clear()
    assert main(["train-reference", "--quick", "--no-progress"]) == 0  # the README's command
    assert ran[0][1] == storage.default_dir().parent / ".reference-quick" != storage.default_dir()


# ---------------------------------------------------------------- captions, seeds and names a user writes

LONG_CAPTION = "a red circle and a blue square on a light background, " * 8  # ~100 tokens


def test_a_caption_past_clips_77_tokens_is_named_with_its_count_before_any_model(tmp_path):
    from sdperf.model import prompts
    from sdperf.imagegen import plan

    captions = [prompts.Caption("ok", "a red circle " * 20), prompts.Caption("long-one", LONG_CAPTION)]
    with pytest.raises(ConfigError, match=r"caption 'long-one' \('a red circle.*\) is 98 CLIP tokens long") as err:
        plan("smoke", captions, tmp_path / "out")
    assert "77" in str(err.value)
    assert not (tmp_path / "out").exists()
    assert len(plan("smoke", captions[:1], tmp_path / "out").keys) == 1  # 62 tokens with start and end: fits


def test_a_long_caption_file_fails_sdperf_generate(tmp_path, capsys):
    (tmp_path / "captions.txt").write_text("a dog\n" + LONG_CAPTION + "\n")
    assert main(["generate", "--profile", "smoke", "--prompts", str(tmp_path / "captions.txt"), "--out",
                 str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "caption '2'" in err and "CLIP tokens long" in err and "Traceback" not in err


@pytest.mark.parametrize("seed", [str(2**64), str(2**63), "-1"])
def test_a_seed_out_of_range_fails_before_the_pipeline_is_built(tmp_path, capsys, monkeypatch, seed):
    from sdperf.model import pipelines

    monkeypatch.setattr(pipelines, "build_pipeline", lambda *a, **k: pytest.fail("the pipeline was built"))
    (tmp_path / "captions.txt").write_text("a dog\n")
    assert main(["generate", "--profile", "smoke", "--prompts", str(tmp_path / "captions.txt"), "--out",
                 str(tmp_path / "out"), "--seeds", seed, "--no-progress"]) == 2
    assert f"seed {seed} is not valid; choose integers from 0 to {2**63 - 1}" in capsys.readouterr().err


def test_the_largest_seed_is_one_torch_takes():
    import torch

    from sdperf.imagegen import keys
    from sdperf.config.profiles import MAX_SEED

    assert keys.check_seeds([MAX_SEED]) == (MAX_SEED,)
    torch.Generator().manual_seed(MAX_SEED)


def test_captions_that_a_spreadsheet_would_run_are_neutralised_and_read_back_as_written(tmp_path):
    import numpy as np
    import pandas as pd

    from sdperf.imagegen import keys, store

    texts = {"1": "=HYPERLINK(\"http://x\")", "2": "+1", "3": "-2", "4": "@SUM(A1)", "5": "'quoted", "6": "plain"}
    ids = {"-id": "id that starts like a formula"}
    rows = []
    for pid, text in {**texts, **ids}.items():
        key = keys.ImageKey(7.5, pid, 0)
        (tmp_path / key.relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key.relpath).write_bytes(store.png_bytes(np.zeros((2, 2, 3), np.uint8)))
        rows.append(dict(key=key.name, prompt_id=pid, caption=text, guidance=7.5, seed=0, file=key.relpath, steps=1,
                         resolution=64, profile="smoke", dtype="float32", commit="c", time_utc="t", rank=0))
    with store.ManifestPart(tmp_path, 0) as part:
        for row in rows:
            part.append(row)
    store.rebuild_manifest(tmp_path)
    raw = pd.read_csv(tmp_path / "manifest.csv", dtype=str, keep_default_na=False)
    assert not raw.caption.str.match(r"^[=+\-@]").any() and not raw.prompt_id.str.match(r"^[=+\-@]").any()
    assert set(raw.caption) >= {"'=HYPERLINK(\"http://x\")", "'+1", "'-2", "'@SUM(A1)", "''quoted", "plain"}
    back = store.read_manifest(tmp_path)
    assert dict(zip(back.prompt_id, back.caption)) == {**texts, **ids}


# ---------------------------------------------------------------- Ctrl-C during a notebook

INTERRUPTED_DRIVER = """import sys
from pathlib import Path
from sdperf.core import environment, paths
from sdperf.measure import doctor
from sdperf.cli import main
environment.git_commit = lambda *a, **k: "0123456789ab"
paths.notebooks_dir = lambda: Path({nbdir!r})
doctor.record = lambda profile: None  # the study's rungs are not these stand-in notebooks'
sys.exit(main(["run", "--profile", "smoke"]))
"""


def test_ctrl_c_during_a_notebook_prints_one_clean_line(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys

    from test_runner import make_notebook

    nbdir, started = tmp_path / "notebooks", tmp_path / "started"
    nbdir.mkdir()
    make_notebook(nbdir / "00_sleep.ipynb", [f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(120)"])
    _params(tmp_path, monkeypatch, {"smoke.yml": _without_section(SMOKE_TEXT, "notebooks")})
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_DRIVER.format(nbdir=str(nbdir))],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the notebook never started"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the terminal's whole foreground group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1].endswith("sdperf: interrupted") and "Traceback" not in err and "Error" not in err, err
    assert [line for line in lines if not line.startswith("sdperf smoke:")] == ["sdperf: interrupted"], err
    reports = tmp_path / "reports" / "smoke" / "notebooks"
    assert (reports / "00_sleep.running.json").is_file() and not (reports / "00_sleep.ipynb").exists()


def test_an_unannotated_notebook_parameter_takes_a_scalar_or_a_flat_list():
    plan.check_parameter_type("x", ["a", 2], "None")
    plan.check_parameter_type("x", "a", None)
    with pytest.raises(ConfigError, match=r"x must be a str, int, float, bool or list .*got dict"):
        plan.check_parameter_type("x", {"a": 1}, "None")


def test_a_profiles_weights_folder_is_verified_before_the_first_notebook(model_copy, tmp_path, monkeypatch):
    (model_copy / "unet" / "extra.safetensors").write_bytes(b"unlisted")
    _params(tmp_path, monkeypatch, {"smoke.yml": SMOKE_TEXT + f"weights: {str(model_copy)!r}\n"})
    with pytest.raises(ConfigError, match=r"does not list: \['unet/extra.safetensors'\]"):
        runner.validate("smoke", ["00"])


def test_a_profile_seed_past_2_63_is_refused(tmp_path, monkeypatch):
    import re

    _params(tmp_path, monkeypatch, {"big.yml": re.sub(r"(?m)^seed:\s*\d+", f"seed: {2**64}", SMOKE_TEXT)})
    with pytest.raises(ConfigError, match=rf"seed must be an integer from 0 to {2**63 - 1} .*got {2**64}"):
        load_profile("big", check_runtime=False)
