"""Grad modes on the tiny pipeline: same picture in every mode, and autograd only records with trainable weights."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sdperf.drift import relative_error
from sdperf.experiments import inference_mode as ex
from sdperf.generation import GRAD_MODES, Workload, generate
from sdperf.optimizations import inference_mode as opt
from sdperf.pipelines import build_pipeline
from sdperf.timing import Timing


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


def test_noise_verdict_reads_the_range_not_the_median(smoke, scratch_reports):
    from sdperf.study import open_study

    study = open_study("smoke", notebook="test_02")
    w = Workload.from_profile(smoke)

    def run(times):
        return SimpleNamespace(timing=Timing(times=times, first_call=times[0]), workload=w)

    noisy = ex._pair(study, "noisy", run([1.00, 1.10, 0.95]), run([0.99, 1.08, 0.93]), "")
    clear = ex._pair(study, "clear", run([1.00, 1.01, 0.99]), run([0.50, 0.51, 0.49]), "")
    assert noisy["speedup"] > 1 and noisy["verdict"].startswith("within noise")
    assert clear["verdict"] == "measurable: the whole range is above 1.0"
    assert set(study.recorder.table()["scenario"]) == {"noisy, batch 1", "clear, batch 1"}


def test_unknown_variant_is_refused_before_anything_runs(smoke):
    study = SimpleNamespace(device="cpu", profile=smoke)
    with pytest.raises(ValueError, match="'fp16'.*grad_trainable"):
        ex.variants(study, ["no_grad", "fp16"])
