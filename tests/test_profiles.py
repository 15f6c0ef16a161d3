"""Profile validation: every bad value fails before any model is built, naming the value and the choices."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from sdperf import paths
from sdperf.errors import ConfigError
from sdperf.profiles import (ARCHITECTURES, DEVICES, DTYPES, SCHEDULERS, available_profiles, load_profile,
                             resolve_name)

REQUIRED_PROFILES = {"smoke", "cpu", "sd15-a10g", "sd15-a100", "sdxl-1024", "sd2-base"}


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


def test_hub_id_is_accepted_as_weights(params_dir):
    assert load_profile(params_dir(weights="runwayml/stable-diffusion-v1-5")).weights == "runwayml/stable-diffusion-v1-5"


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
    code = ("import sys\nfrom sdperf.profiles import load_profile\n"
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
