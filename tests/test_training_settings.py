"""The profiles' training sections: every one validates, and every bad value fails naming it and the choices."""
from __future__ import annotations

import time

import pytest
import yaml

from sdperf.core import paths
from sdperf.core.errors import ConfigError
from sdperf.config.profiles import available_profiles, load_profile
from sdperf.training import training_settings


def _smoke_training() -> dict:
    return yaml.safe_load((paths.REPO_ROOT / "params" / "smoke.yml").read_text())["training"]


@pytest.mark.parametrize("name", available_profiles())
def test_every_profile_has_a_valid_training_section(name):
    prof = load_profile(name, check_runtime=False)
    s = training_settings.from_profile(prof)
    assert s.steps >= 1 and s.batch_sizes and s.unet_width > 0


def test_cpu_profile_trains_something_two_ranks_can_hold():
    """The real SD 1.5 UNet needs ~14 GB of fp32 weights + gradients + AdamW moments per rank: the cpu profile
    must train a narrower one so that two ranks fit beside each other in 24 GiB."""
    from sdperf.experiments.training_scaling import unet_parameters

    s = training_settings.from_profile(load_profile("cpu", check_runtime=False))
    state_gib = unet_parameters("sd15", s.unet_width) * 16 / 2**30
    assert s.unet_width < 1.0 and 2 in s.world_sizes and 2 * state_gib < 4


@pytest.mark.parametrize("key,value,expected", [
    ("autocast", "fp8", ["'fp8'", "none", "bfloat16", "float16"]),
    ("backend", "mpi", ["'mpi'", "auto", "gloo", "nccl"]),
    ("data", "laion", ["'laion'", "synthetic", "encoded"]),
    ("deepspeed_zero_stages", [3], ["3", "1, 2"]),
    ("world_sizes", [0], ["world_sizes entry", ">= 1"]),
    ("batch_sizes", [], ["batch_sizes", "non-empty"]),
    ("samples", 1, ["samples 1", ">= 2"]),  # smoke: 2 ranks x 1 per rank
    ("images_dir", "/no/such/folder", ["/no/such/folder", "null"]),
    ("steps", 0, ["steps", ">= 1"]),
])
def test_bad_values_name_the_value_and_the_choices(key, value, expected):
    raw = dict(_smoke_training(), **{key: value})
    with pytest.raises(ConfigError) as err:
        training_settings.parse("smoke", "tiny", raw)
    msg = str(err.value)
    assert f"training.{key}" in msg or key in msg
    assert all(e in msg for e in expected), msg


def test_unknown_and_missing_keys_are_named():
    with pytest.raises(ConfigError, match=r"unknown key 'lr'; valid keys: unet_width, resolution"):
        training_settings.parse("smoke", "tiny", dict(_smoke_training(), lr=1))
    raw = _smoke_training()
    del raw["steps"]
    with pytest.raises(ConfigError, match="missing keys steps"):
        training_settings.parse("smoke", "tiny", raw)
    with pytest.raises(ConfigError, match="section is empty"):
        training_settings.parse("smoke", "tiny", {})


def test_a_width_the_unet_cannot_take_lists_the_widths_it_can():
    with pytest.raises(ConfigError) as err:
        training_settings.parse("cpu", "sd15", dict(_smoke_training(), unet_width=0.25, resolution=256))
    msg = str(err.value)
    assert "0.25" in msg and "80 channels" in msg and "valid for sd15: 0.1, 0.2, 0.3" in msg
    assert training_settings.valid_widths("tiny") == [1.0]


def test_settings_round_trip_through_json():
    s = training_settings.parse("smoke", "tiny", _smoke_training())
    assert training_settings.TrainingSettings.from_dict(s.to_dict()) == s


def test_validation_is_fast_and_builds_nothing():
    t0 = time.perf_counter()
    with pytest.raises(ConfigError):
        training_settings.parse("smoke", "tiny", dict(_smoke_training(), backend="mpi"))
    assert time.perf_counter() - t0 < 1.0
