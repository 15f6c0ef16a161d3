"""Every input a user controls, broken one way at a time: `sdperf` answers within 5 seconds with an error (exit 2)
that names the bad value and the rule or the valid choices, exit 2, no traceback, and no model built.

Profiles go through `sdperf run` (validation covers every section before the first notebook; if a case passed it,
`runner._run_locked` fails the test instead of starting the study), prompts files and output folders through
`sdperf generate`. The other tests check each rule's details; this table checks the class as a user meets it.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from sdperf.core import paths
from sdperf.cli import main

DELETE = object()  # a profile key to remove
SMOKE = yaml.safe_load((paths.REPO_ROOT / "params" / "smoke.yml").read_text())


@dataclass
class Case:
    id: str
    setup: Callable[[Path], list[str]]  # writes what the case needs under tmp_path, returns the argv
    expect: str  # a regex the error line must match: the value and the rule or the choices

    def __repr__(self) -> str:
        return self.id


def _write_profile(tmp: Path, data: dict | None = None, text: str | bytes | None = None) -> list[str]:
    path = tmp / "params" / "bad.yml"
    if text is not None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    else:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return ["run", "--profile", "bad"]


def profile(**changes) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        data = dict(SMOKE)
        for key, value in changes.items():
            if value is DELETE:
                data.pop(key)
            else:
                data[key] = value(tmp) if callable(value) else value
        return _write_profile(tmp, data)
    return setup


def section(name: str, **changes) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        return _write_profile(tmp, dict(SMOKE, **{name: dict(SMOKE[name], **changes)}))
    return setup


def profile_text(text: str | bytes) -> Callable[[Path], list[str]]:
    return lambda tmp: _write_profile(tmp, text=text)


def argv(*args: str) -> Callable[[Path], list[str]]:
    return lambda tmp: [a.format(tmp=tmp) for a in args]


def _captions(tmp: Path, text: str = "a red bicycle\ntwo dogs on a beach\n", name: str = "captions.txt") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def generate(*args: str, prompts: Callable[[Path], Path] = _captions, out: Callable[[Path], Path] | None = None):
    def setup(tmp: Path) -> list[str]:
        folder = out(tmp) if out else tmp / "out"
        return ["generate", "--profile", "smoke", "--no-progress", "--prompts", str(prompts(tmp)),
                "--out", str(folder), *[a.format(tmp=tmp) for a in args]]
    return setup


def _raw_file(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name
    return make


def _made_folder(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).mkdir()
        return tmp / name
    return make


def _folder_with(files: dict[str, str | None]) -> Callable[[Path], Path]:
    """An output folder holding `files` (None: a folder)."""
    def make(tmp: Path) -> Path:
        out = tmp / "out"
        out.mkdir()
        for name, content in files.items():
            (out / name).mkdir(parents=True) if content is None else (out / name).write_text(content)
        return out
    return make


def _reports_blocked(tmp: Path) -> list[str]:
    (tmp / "reports" / "smoke").mkdir(parents=True)
    (tmp / "reports" / "smoke" / "notebooks").write_text("a file where the executed notebooks go")
    return []


def _empty_weights(tmp: Path) -> str:
    (tmp / "empty-weights").mkdir()
    return str(tmp / "empty-weights")


def _legacy_folder(tmp: Path) -> Path:
    """A folder made before captions were hashed, whose caption '1' was another text."""
    out = _folder_with({"parts": None})(tmp)
    row = dict(key="k", prompt_id="1", caption="a blue car", guidance=7.5, seed=0, file="g7.5/1_s0.png", steps=4,
               resolution=64, profile="smoke", dtype="float32", commit="x", time_utc="2026-01-01T00:00:00", rank=0)
    (out / "parts" / "rank-0.jsonl").write_text(json.dumps(row) + "\n")
    settings = dict(profile="smoke", arch="tiny", resolution=64, steps=4, scheduler="plms", dtype="float32",
                    weights=None, weights_seed=0)
    (out / "run.json").write_text(json.dumps(settings))
    return out


CASES = [
    # --- the profile's top-level values: types, choices, ranges
    Case("arch", profile(arch="sd99"), r"arch 'sd99' is not valid; choose one of: .*sd15"),
    Case("scheduler", profile(scheduler="fast"), r"scheduler 'fast' is not valid; choose one of: .*plms"),
    Case("dtype", profile(dtype="float8"), r"dtype 'float8' is not valid; choose one of: float32"),
    Case("device", profile(device="tpu"), r"device 'tpu' is not valid; choose one of: .*cpu"),
    Case("steps-zero", profile(steps=0), r"steps must be an integer >= 1, got 0"),
    Case("steps-text", profile(steps="ten"), r"steps must be an integer >= 1, got 'ten'"),
    Case("steps-float", profile(steps=2.5), r"steps must be an integer >= 1, got 2\.5"),
    Case("steps-bool", profile(steps=True), r"steps must be an integer >= 1, got True"),
    Case("repeats", profile(repeats=0), r"repeats must be an integer >= 1, got 0"),
    Case("resolution-multiple", profile(resolution=100), r"resolution 100 must be a multiple of \d+ for arch 'tiny'"),
    Case("resolution-negative", profile(resolution=-64), r"resolution must be an integer >= 1, got -64"),
    Case("resolution-memory", profile(resolution=100000),
         r"resolution 100000 at batch 4 needs more than .* and this machine has .*choose a smaller resolution"),
    Case("matmul-memory", profile(matmul_size=1000000),
         r"matmul_size 1000000 needs .*this machine has .*choose at most \d+"),
    Case("matmul-zero", profile(matmul_size=0), r"matmul_size must be an integer >= 1, got 0"),
    Case("warmup-zero", profile(warmup=0), r"warmup must be an integer >= 1, got 0: it counts the first call"),
    Case("warmup-negative", profile(warmup=-1), r"warmup must be an integer >= 1, got -1"),
    Case("seed-negative", profile(seed=-1), r"seed must be an integer >= 0, got -1"),
    Case("seed-text", profile(seed="x"), r"seed must be an integer >= 0, got 'x'"),
    Case("guidance-text", profile(guidance_scale="high"), r"guidance_scale must be a finite number >= 1 .*got 'high'"),
    Case("guidance-negative", profile(guidance_scale=-1), r"guidance_scale must be a finite number >= 1 .*got -1"),
    Case("guidance-below-one", profile(guidance_scale=0.5), r"guidance_scale must be a finite number >= 1 .*got 0\.5"),
    Case("guidance-nan", profile(guidance_scale=float("nan")), r"guidance_scale must be a finite number .*got nan"),
    Case("guidance-inf", profile(guidance_scale=float("inf")), r"guidance_scale must be a finite number .*got inf"),
    Case("guidance-bool", profile(guidance_scale=True), r"guidance_scale must be a finite number .*got True"),
    Case("guidance-null", profile(guidance_scale=None), r"guidance_scale must be a finite number .*got None"),
    Case("prompt-null", profile(prompt=None), r"prompt must be a non-empty string, got None"),
    Case("prompt-empty", profile(prompt=""), r"prompt must be a non-empty string, got ''"),
    Case("prompt-number", profile(prompt=5), r"prompt must be a non-empty string, got 5"),
    Case("batch-sizes-empty", profile(batch_sizes=[]), r"batch_sizes must be a non-empty list of integers, got \[\]"),
    Case("batch-sizes-zero", profile(batch_sizes=[1, 0]), r"batch_sizes entry must be an integer >= 1, got 0"),
    Case("batch-sizes-text", profile(batch_sizes="1"), r"batch_sizes must be a non-empty list of integers, got '1'"),
    Case("cell-timeout", profile(cell_timeout_s=0), r"cell_timeout_s must be an integer >= 1, got 0"),
    Case("variant-budget", profile(variant_budget_s=-5), r"variant_budget_s must be an integer >= 1, got -5"),
    Case("rounds", profile(rounds=2), r"rounds must be an integer >= 3, got 2"),
    Case("scheduler-drift", profile(scheduler_drift="no"), r"scheduler_drift must be true or false, got 'no'"),
    Case("first-call-steps", profile(first_call_steps=0), r"first_call_steps must be an integer >= 1, got 0"),
    Case("description", profile(description=5), r"description must be a string, got 5"),
    Case("notes", profile(notes="one note"), r"notes must be a list of strings, got 'one note'"),
    Case("unknown-key", profile(stpes=5), r"unknown key 'stpes'; valid keys: .*steps"),
    Case("missing-key", profile(steps=DELETE), r"missing keys steps"),
    Case("section-not-mapping", profile(training=[1, 2]), r"training must be a mapping of key: value, got \[1, 2\]"),
    # --- weights: an existing folder or an explicit hub id
    Case("weights-missing-folder", profile(weights="models/sd15"),
         r"weights folder 'models/sd15' does not exist .*'hub:models/sd15'"),
    Case("weights-bad-hub-id", profile(weights="hub:no id"), r"weights 'hub:no id' is not a hub id; write 'hub:org/model'"),
    Case("weights-number", profile(weights=5), r"weights must be a local diffusers folder or 'hub:org/model', got 5"),
    Case("weights-not-diffusers", profile(weights=_empty_weights), r"empty-weights' has no model_index\.json"),
    # --- the sections other notebooks read, checked before the first notebook
    Case("training-steps", section("training", steps=0), r"steps.*0"),
    Case("training-world-sizes", section("training", world_sizes=[0]), r"world_sizes.*0"),
    Case("training-data", section("training", data="imagenet"), r"data.*'imagenet'.*synthetic"),
    Case("quality-n-images", section("quality", n_images=1), r"n_images.*1"),
    Case("quality-guidance", section("quality", guidance_scales=["high"]), r"guidance_scales.*'high'"),
    Case("quality-clip-arch", section("quality", clip_arch="ViT-Z"), r"clip_arch.*'ViT-Z'"),
    Case("serving-design", section("serving", designs=["magic"]), r"designs.*'magic'.*stacked"),
    Case("serving-scenario", section("serving", scenarios=["Offline", "Burst"]), r"scenarios.*'Burst'.*Server"),
    Case("serving-load", section("serving", server_load=0), r"server_load.*0"),
    Case("techniques-twice", profile(techniques=["tome:0.5", "deepcache:3", "tome:0.5"]),
         r"techniques names tome:0.5 more than once; name each key once"),
    Case("techniques-unknown", profile(techniques=["tome:0.5", "tome:nope"]),
         r"techniques: technique 'tome:nope'.*"),
    Case("techniques-not-a-list", profile(techniques="tome:0.5"), r"techniques must be a list of catalog keys"),
    Case("notebooks-unknown", profile(notebooks={"99_nope": {}}), r"unknown notebook '99_nope'; valid notebooks: "),
    Case("notebooks-parameter", profile(notebooks={"09_fewer_steps": {"variantz": []}}),
         r"09_fewer_steps has no parameter 'variantz'; valid parameters: "),
    # --- the profile file itself
    Case("yaml-duplicate-key", profile_text("steps: 4\nsteps: 5\n"), r"duplicate key 'steps'"),
    Case("yaml-syntax", profile_text("steps: [4\n"), r"bad\.yml is not valid YAML"),
    Case("yaml-binary", profile_text(b"\x00\xff\xfe binary"), r"bad\.yml cannot be read as UTF-8 text"),
    Case("yaml-list", profile_text("- steps\n- 4\n"), r"bad\.yml must be a mapping of key: value"),
    Case("profile-empty-name", argv("run", "--profile", ""), r"profile name '' is empty; valid profiles: .*smoke"),
    Case("profile-unknown", argv("run", "--profile", "nope"), r"unknown profile 'nope'; valid profiles: .*smoke"),
    Case("profile-path", argv("run", "--profile", "../params/smoke"),
         r"profile name '\.\./params/smoke' is not valid: use letters, digits"),
    Case("reports-not-a-folder", lambda tmp: _reports_blocked(tmp) + ["run", "--profile", "smoke"],
         r"smoke/notebooks' is not a folder, but the run writes its reports there"),
    Case("only-unknown", argv("run", "--profile", "smoke", "--only", "nope"), r"unknown notebook 'nope'; valid"),
    # --- sdperf generate: prompts files, output folders, values
    Case("prompts-missing", generate(prompts=lambda tmp: tmp / "none.txt"), r"none\.txt.*does not exist"),
    Case("prompts-empty", generate(prompts=lambda tmp: _captions(tmp, "")), r"captions\.txt.*is empty"),
    Case("prompts-binary", generate(prompts=_raw_file("b.txt", b"\xff\xfe\x00bad")), r"b\.txt.*UTF-8"),
    Case("prompts-json", generate(prompts=lambda tmp: _captions(tmp, "{not json", "c.json")), r"is not valid JSON"),
    Case("prompts-format", generate(prompts=lambda tmp: _captions(tmp, "x\n", "c.csv")), r"unknown format '\.csv'"),
    Case("prompts-folder", generate(prompts=_made_folder("c.txt")), r"c\.txt': is a folder, not a file; expected"),
    Case("prompts-no-suffix", generate(prompts=lambda tmp: _captions(tmp, "x\n", "captions")),
         r"unknown format '\(no suffix\)'; accepted formats: \.json"),
    Case("guidance-word", generate("--guidance", "strong"), r"guidance 'strong' is not valid; choose finite numbers"),
    Case("seed-word", generate("--seeds", "x"), r"seed 'x' is not valid; choose integers from 0 to 2\*\*63-1"),
    Case("batch-size", generate("--batch-size", "0"), r"batch size 0 is not valid; choose an integer >= 1"),
    Case("steps", generate("--steps", "0"), r"steps 0 is not valid; choose an integer >= 1"),
    Case("dtype-generate", generate("--dtype", "float8"), r"dtype 'float8' is not valid; choose one of"),
    Case("num-prompts", generate("--num-prompts", "3"), r"asked for n=3 captions but the set holds only 2"),
    Case("out-is-file", generate(out=lambda tmp: _captions(tmp, "x", "taken")), r"taken' is a file, not a folder"),
    Case("out-other-settings", generate(out=_folder_with({"run.json": json.dumps({"profile": "cpu"})})),
         r"profile: folder has 'cpu', this run 'smoke'"),
    Case("out-run-json-broken", generate(out=_folder_with({"run.json": "{"})), r"run\.json' is not valid JSON"),
    Case("out-guidance-is-file", generate(out=_folder_with({"g7.5": "x"})), r"g7\.5' is not a folder"),
    Case("out-other-captions", generate(out=_legacy_folder),
         r"caption id '1' was generated from 'a blue car', this run gives it 'a red bicycle'"),
]


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    """A params folder of this test's own, and every way past validation turned into a failure."""
    import sdperf.imagegen.folder as folder
    from sdperf.model import pipelines
    from sdperf.run import runner

    (tmp_path / "params").mkdir()
    for name in ("smoke", "cpu"):
        (tmp_path / "params" / f"{name}.yml").write_text((paths.REPO_ROOT / "params" / f"{name}.yml").read_text())
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(tmp_path / "params"))
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("SDPERF_PROFILE", "smoke")

    def passed(*a, **k):
        raise AssertionError("the input passed validation: this case is not caught")

    monkeypatch.setattr(runner, "_run_locked", passed)
    monkeypatch.setattr(folder, "_build", passed)
    monkeypatch.setattr(pipelines, "build_pipeline", passed)
    return tmp_path


def test_the_table_covers_sixty_bad_inputs():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_input_fails_fast_with_one_line_naming_it(case, guarded, capsys):
    args = case.setup(guarded)
    start = time.perf_counter()
    code = main(args)
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}: {err}"
    assert err.startswith("sdperf: error: ") and "Traceback" not in err, err
    assert re.search(case.expect, err), err
    assert elapsed < 5, f"took {elapsed:.1f}s"
    assert not (guarded / "reports").exists() or not any((guarded / "reports").rglob("*.csv"))
