"""Profile validation: every bad value fails before any model is built, naming the value and the choices."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sdperf.core import paths
from sdperf.core.errors import ConfigError
from sdperf.config.profiles import (ARCHITECTURES, DEVICES, DTYPES, SCHEDULERS, available_profiles, load_profile,
                             resolve_name)

REQUIRED_PROFILES = {"smoke", "cpu", "cpu-full", "sd15-a10g", "sd15-a100", "sdxl-1024", "sd2-base"}


def test_every_profile_named_in_the_study_exists_and_loads():
    assert REQUIRED_PROFILES <= set(available_profiles())
    for name in available_profiles():
        prof = load_profile(name, check_runtime=False)
        assert prof.name == name and prof.arch in ARCHITECTURES and prof.steps >= 1


def test_every_profile_value_carries_a_why_comment():
    for path in paths.params_dir().glob("*.yml"):
        for line in path.read_text().splitlines():
            if line and not line.startswith("#") and ":" in line and not line.startswith(("description", "prompt")):
                assert "#" in line, f"{path.name}: {line!r} has no why-comment"


def test_seed_settings_are_the_seeds_exact_settings():
    a100 = load_profile("sd15-a100", check_runtime=False)
    assert (a100.resolution, a100.steps, a100.scheduler, a100.dtype, a100.batch_sizes) == (512, 50, "plms", "float16", (1, 2, 4))
    xl = load_profile("sdxl-1024", check_runtime=False)
    assert (xl.arch, xl.resolution, xl.steps, xl.dtype) == ("sdxl", 1024, 20, "float16")
    cpu = load_profile("cpu", check_runtime=False)
    assert (cpu.arch, cpu.resolution, cpu.device) == ("sd15", 256, "cpu")


def test_the_hour_cpu_profile_is_a_subset_of_cpu_full_on_the_same_settings():
    """`cpu` is cpu-full's one-hour subset (issue 33): the same model, timing, rounds and sections, fewer keys. Every
    key a cpu notebook compares, judges or searches is one cpu-full lists too, so nothing in the hour's report is
    missing from the full one; what differs in the quality section is only how much is judged."""
    hour, full = (load_profile(n, check_runtime=False) for n in ("cpu", "cpu-full"))
    for field in ("arch", "resolution", "steps", "scheduler", "guidance_scale", "batch_sizes", "dtype", "device",
                  "warmup", "repeats", "rounds", "first_call_steps", "seed", "prompt", "training", "serving"):
        assert getattr(hour, field) == getattr(full, field), field
    sized = {"reference_n_images", "reference_judge_guidances", "reference_fallbacks"}
    assert {k: v for k, v in hour.quality.items() if k not in sized} == \
        {k: v for k, v in full.quality.items() if k not in sized}
    assert set(hour.quality["reference_judge_guidances"]) <= set(full.quality["reference_judge_guidances"])
    from sdperf.run.prefetch import parameters

    for notebook in hour.notebooks:  # each against what cpu-full runs: its own setting, else the notebook's default
        theirs = parameters(notebook, full)
        for key, value in hour.notebooks[notebook].items():
            if isinstance(value, list):
                assert set(value) <= set(theirs[key]), (notebook, key, set(value) - set(theirs[key]))
            elif isinstance(value, bool):  # a section the hour may leave out, never one only it runs
                assert value <= theirs[key], (notebook, key)
            else:
                assert key == "search_max_quality" and value <= theirs[key], (notebook, key)


def test_unknown_profile_names_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        load_profile("nope")
    msg = str(err.value)
    assert "'nope'" in msg and all(name in msg for name in REQUIRED_PROFILES)


@pytest.fixture
def params_dir(tmp_path, monkeypatch):
    """A private params/ holding a copy of smoke, so each test can break one value."""
    d = tmp_path / "params"
    d.mkdir()
    base = yaml.safe_load((paths.REPO_ROOT / "params" / "smoke.yml").read_text())
    monkeypatch.setenv("SDPERF_PARAMS_DIR", str(d))

    def write(**changes):
        data = dict(base, **changes)
        for k, v in list(data.items()):
            if v is None:
                del data[k]
        (d / "bad.yml").write_text(yaml.safe_dump(data))
        return "bad"
    return write


@pytest.mark.parametrize("key,value,valid", [
    ("arch", "sd3", ARCHITECTURES), ("scheduler", "heun", SCHEDULERS), ("dtype", "float8", DTYPES),
    ("device", "tpu", DEVICES),
])
def test_bad_choice_names_value_and_choices(params_dir, key, value, valid):
    name = params_dir(**{key: value})
    with pytest.raises(ConfigError) as err:
        load_profile(name)
    msg = str(err.value)
    assert repr(value) in msg and key in msg and all(v in msg for v in valid)


def test_unknown_key_lists_valid_keys(params_dir):
    with pytest.raises(ConfigError, match=r"unknown key 'stepz'.*steps"):
        load_profile(params_dir(stepz=3))


def test_missing_key_is_named(params_dir):
    with pytest.raises(ConfigError, match="missing keys steps"):
        load_profile(params_dir(steps=None))


@pytest.mark.parametrize("key,value", [("steps", 0), ("repeats", -1), ("batch_sizes", []), ("resolution", 60),
                                       ("first_call_steps", 0)])
def test_bad_numbers_fail(params_dir, key, value):
    with pytest.raises(ConfigError, match=key if key != "batch_sizes" else "batch_sizes"):
        load_profile(params_dir(**{key: value}))


def test_scheduler_drift_must_be_a_boolean(params_dir):
    assert load_profile(params_dir()).scheduler_drift is True  # measured unless a profile says otherwise
    assert load_profile(params_dir(scheduler_drift=False)).scheduler_drift is False
    with pytest.raises(ConfigError, match="scheduler_drift must be true or false, got 'no'"):
        load_profile(params_dir(scheduler_drift="no"))


def test_missing_weights_folder_fails(params_dir, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(params_dir(weights=str(tmp_path / "no-such-folder")))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="model_index.json"):
        load_profile(params_dir(weights=str(empty)))


def test_a_hub_id_is_accepted_only_when_written_explicitly(params_dir, tmp_path, monkeypatch):
    from sdperf.config.profiles import weights_source

    hub = "hub:runwayml/stable-diffusion-v1-5"
    assert load_profile(params_dir(weights=hub)).weights == hub
    assert weights_source(hub) == ("runwayml/stable-diffusion-v1-5", False)
    monkeypatch.chdir(tmp_path)
    # a relative folder that is missing reads like 'org/model': it is a typo'd path, not a download
    with pytest.raises(ConfigError, match=r"weights folder 'models/sd15' does not exist \(looked at '.*models/sd15'\)"
                                          r".*write 'hub:models/sd15'"):
        load_profile(params_dir(weights="models/sd15"))
    with pytest.raises(ConfigError, match=r"weights 'hub:not a hub id' is not a hub id; write 'hub:org/model'"):
        load_profile(params_dir(weights="hub:not a hub id"))
    (tmp_path / "models" / "sd15").mkdir(parents=True)
    (tmp_path / "models" / "sd15" / "model_index.json").write_text("{}")
    assert weights_source(load_profile(params_dir(weights="models/sd15")).weights) == (str(Path("models/sd15")), True)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_profile_without_gpu_fails_naming_available_devices(params_dir):
    with pytest.raises(ConfigError, match=r"device 'cuda' is not available.*available devices: cpu"):
        load_profile(params_dir(device="cuda"))


def test_auto_resolves_env_then_hardware(monkeypatch):
    monkeypatch.setenv("SDPERF_PROFILE", "smoke")
    assert resolve_name("auto") == "smoke" and resolve_name(None) == "smoke"
    assert resolve_name("cpu") == "cpu"  # an explicit name is not overridden
    monkeypatch.delenv("SDPERF_PROFILE")
    import torch

    assert (resolve_name("auto") == "cpu") == (not torch.cuda.is_available())


def test_bad_profile_fails_fast_without_building_anything():
    code = ("import sys\nfrom sdperf.config.profiles import load_profile\n"
            "try:\n    load_profile('nope')\nexcept ValueError as e:\n    print('ERR', e)\n"
            "print('diffusers' in sys.modules, 'torch' in sys.modules)")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "ERR unknown profile 'nope'" in out
    assert out.strip().endswith("False False"), out  # neither diffusers nor torch was imported
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("section", ["training", "quality", "serving"])
def test_a_study_section_must_be_a_mapping(params_dir, section):
    with pytest.raises(ConfigError, match=rf"{section} must be a mapping.*\[1, 2\]"):
        load_profile(params_dir(**{section: [1, 2]}))
    assert getattr(load_profile(params_dir(**{section: {"x": 1}}), check_runtime=False), section) == {"x": 1}


@pytest.mark.parametrize("value", ["high", -1, 0.5, float("nan"), float("inf"), True, None])
def test_guidance_must_be_a_finite_number_of_at_least_one(params_dir, value):
    bad = params_dir(guidance_scale=value) if value is not None else params_dir(guidance_scale="")
    with pytest.raises(ConfigError) as err:
        load_profile(bad, check_runtime=False)
    assert "guidance_scale must be a finite number >= 1" in str(err.value) and "7.5" in str(err.value)
    assert load_profile(params_dir(guidance_scale=1), check_runtime=False).guidance_scale == 1.0


@pytest.mark.parametrize("value", [None, "", 3, ["a"]])
def test_prompt_must_be_text(params_dir, value):
    with pytest.raises(ConfigError, match=r"prompt must be a non-empty string"):
        load_profile(params_dir(prompt=value) if value is not None else _with_null(params_dir, "prompt"),
                     check_runtime=False)


def _with_null(params_dir, key):
    """The profile with `key: null` (the fixture drops keys set to None)."""
    name = params_dir(**{key: None})
    path = paths.params_dir() / f"{name}.yml"
    path.write_text(path.read_text() + f"{key}: null\n")
    return name


def test_a_key_given_twice_is_refused_naming_both_lines(params_dir):
    name = params_dir()
    path = paths.params_dir() / f"{name}.yml"
    path.write_text(path.read_text() + "steps: 40\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'steps' \(first on line \d+, again on line \d+\)"):
        load_profile(name, check_runtime=False)


def test_a_section_key_given_twice_is_refused(params_dir):
    name = params_dir()
    path = paths.params_dir() / f"{name}.yml"
    path.write_text(path.read_text().replace("quality:\n", "quality:\n  n_images: 9\n", 1))
    with pytest.raises(ConfigError, match=r"duplicate key 'n_images'"):
        load_profile(name, check_runtime=False)


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_profile_name_is_refused_not_taken_for_auto(name):
    with pytest.raises(ConfigError, match=r"profile name .* is empty; valid profiles: .*cpu.*smoke"):
        load_profile(name, check_runtime=False)


def test_sizes_beyond_this_machines_memory_fail_with_the_estimate(params_dir):
    with pytest.raises(ConfigError, match=r"resolution 100000 at batch 4 needs more than [\d,.]+ GiB .* this "
                                          r"machine has [\d,.]+ GiB"):
        load_profile(params_dir(resolution=100000), check_runtime=False)
    with pytest.raises(ConfigError, match=r"matmul_size 1000000 needs [\d,.]+ GiB .*choose at most \d+"):
        load_profile(params_dir(matmul_size=1000000), check_runtime=False)


def test_a_binary_profile_is_an_error_not_a_traceback(params_dir):
    name = params_dir()
    (paths.params_dir() / f"{name}.yml").write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(ConfigError, match=rf"profile '{name}'"):
        load_profile(name, check_runtime=False)


@pytest.mark.parametrize("section,key,value,expect", [
    ("training", "steps", 0, "steps"), ("quality", "n_images", "many", "n_images"),
    ("serving", "scenarios", ["Offline", "Burst"], "Burst")])
def test_the_runner_checks_every_section_before_any_notebook(params_dir, section, key, value, expect):
    from sdperf.run import runner

    base = yaml.safe_load((paths.REPO_ROOT / "params" / "smoke.yml").read_text())
    name = params_dir(**{section: dict(base[section], **{key: value})})
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=expect):
        runner.validate(name, None)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("expected,match", [
    ({"notebooks_s": {"00_baseline": 30}}, "measured_on must say"),
    ({"measured_on": "here", "rounds_per_worker_s": 0}, r"rounds_per_worker_s must be a positive number .* got 0"),
    ({"measured_on": "here", "notebooks_s": {"00_baseline": "soon"}}, r"notebooks_s\['00_baseline'\] .* got 'soon'"),
    ({"measured_on": "here", "notebooks_s": [30]}, "notebooks_s must be a mapping"),
    ({"measured_on": "here", "total_s": 30}, "unknown key 'total_s'; valid keys: measured_on, rounds_per_worker_s"),
])
def test_a_profiles_time_estimate_names_its_machine_and_holds_positive_seconds(params_dir, expected, match):
    assert load_profile(params_dir(expected={"measured_on": "x", "notebooks_s": {"00_baseline": 1.5}}),
                        check_runtime=False).expected["notebooks_s"] == {"00_baseline": 1.5}
    with pytest.raises(ConfigError, match=match):
        load_profile(params_dir(expected=expected), check_runtime=False)


def test_every_committed_estimate_names_the_studys_notebooks_and_parts():
    """A profile's expected: figures are only read by name (a name nothing runs under is never used, and the ETA
    line then says which part has no figure): the committed ones must name real notebooks."""
    names = {p.stem for p in (paths.REPO_ROOT / "notebooks").glob("*.ipynb")}
    with_estimate = [p for p in available_profiles() if load_profile(p, check_runtime=False).expected]
    assert {"smoke", "cpu"} <= set(with_estimate)
    for name in with_estimate:
        per = load_profile(name, check_runtime=False).expected["notebooks_s"]
        assert set(per) == names, (name, set(per) ^ names)
