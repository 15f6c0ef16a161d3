"""Grad modes on the tiny pipeline: same picture in every mode, and autograd only records with trainable weights."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from sdperf.measure.drift import relative_error
from sdperf.core.errors import ConfigError
from sdperf.experiments import inference_mode as ex
from sdperf.model.generation import GRAD_MODES, Workload, generate
from sdperf.optimizations import inference_mode as opt
from sdperf.model.pipelines import build_pipeline


@pytest.fixture(scope="module")
def workload(smoke):
    return Workload.from_profile(smoke, batch_size=1, steps=2)


@pytest.fixture(scope="module")
def trainable_pipe(smoke):
    return opt.apply(build_pipeline(smoke), "trainable")


@pytest.fixture(scope="module")
def reference(tiny_pipe, workload):
    return generate(tiny_pipe, workload, grad_mode="inference_mode")


def test_every_mode_is_available_and_says_what_it_records():
    for mode in GRAD_MODES:
        ok, reason = opt.availability("cpu", mode)
        assert ok and reason.startswith(f"{mode} on cpu")
    with pytest.raises(ValueError, match="'autocast'.*inference_mode"):
        opt.availability("cpu", "autocast")


def test_apply_switches_requires_grad_on_every_network(smoke, tiny_pipe, trainable_pipe):
    frozen, trainable = opt.trainable_parameters(tiny_pipe), opt.trainable_parameters(trainable_pipe)
    assert frozen["requiring_grad"] == 0 < frozen["parameters"]  # sdperf builds every network frozen
    assert trainable["requiring_grad"] == trainable["parameters"] == frozen["parameters"]
    with pytest.raises(ValueError, match="'half'.*frozen, trainable"):
        opt.apply(tiny_pipe, "half")


@pytest.mark.parametrize("mode", ["no_grad", "grad"])
def test_no_grad_and_frozen_grad_give_the_identical_picture(tiny_pipe, workload, reference, mode):
    out = generate(tiny_pipe, workload, grad_mode=mode)
    assert torch.equal(out.latents, reference.latents) and torch.equal(out.images, reference.images)


def test_trainable_grad_stays_within_1e_6_of_inference_mode(trainable_pipe, workload, reference):
    out = generate(trainable_pipe, workload, grad_mode="grad")
    assert relative_error(out.latents, reference.latents) <= 1e-6
    assert not out.latents.requires_grad  # the graph does not leak out of generate


def test_autograd_keeps_activations_only_for_grad_with_trainable_weights(tiny_pipe, trainable_pipe, workload):
    assert ex.saved_for_backward(tiny_pipe, workload, "grad")["saved_for_backward_mib"] == 0
    for mode in ("no_grad", "inference_mode"):
        assert ex.saved_for_backward(trainable_pipe, workload, mode)["saved_for_backward_mib"] == 0
    held = ex.saved_for_backward(trainable_pipe, workload, "grad")
    latents_mib = 4 * 32 * 32 * 4 / 2**20  # one latent tensor of this workload
    assert held["saved_storages"] > 100 and held["saved_for_backward_mib"] > 10 * latents_mib


def test_the_cerebrium_step_is_the_ratio_of_ratios_per_round():
    # per round, inference_mode's and no_grad's ratios to the same interpolated baseline
    ratios = pd.DataFrame({"config": ["no_grad", "im", "no_grad", "im", "no_grad", "im", "other", "other"],
                           "round": [0, 0, 1, 1, 2, 2, 0, 1], "speedup": [1.0, 1.1, 0.8, 0.84, 0.5, 0.51, 2, 2]})
    step = ex.step_ratio(ratios, "no_grad", "im")
    assert step.round(6).tolist() == [1.1, 1.05, 1.02]
    assert ex.step_ratio(ratios, "no_grad", "missing").empty


def test_the_claim_is_faster_only_when_its_whole_range_clears_the_noise_band():
    step = pd.Series([1.1, 1.05, 1.02])
    assert ex._claim_row("c", step, (0.97, 1.03), "")["verdict"] == "within noise"  # 1.02 is inside the band
    row = ex._claim_row("c", step, (0.98, 1.01), "")
    assert (row["verdict"], row["speedup"], row["speedup_lo"], row["rounds"]) == ("faster", 1.05, 1.02, 3)


def test_configs_are_catalog_keys_in_the_profiles_precision(smoke):
    study = SimpleNamespace(profile=smoke)
    assert ex.configs(study, ["grad:no_grad", "grad:grad+parameters:trainable"]) == [
        ("no_grad", "grad:no_grad"), ("grad on, parameters trainable", "grad:grad+parameters:trainable")]
    half = SimpleNamespace(profile=SimpleNamespace(dtype="float16"))
    assert ex.configs(half, ["grad:no_grad"]) == [("no_grad, float16", "precision:float16+grad:no_grad")]


def test_unknown_variant_is_refused_before_anything_runs(smoke):
    study = SimpleNamespace(profile=smoke)
    with pytest.raises(ConfigError, match="'grad:fp16'"):
        ex.configs(study, ["grad:no_grad", "grad:fp16"])
