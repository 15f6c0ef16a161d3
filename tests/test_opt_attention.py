"""Attention processors and SDPA backends on the tiny pipeline: same picture within float32 rounding, the backend
restriction really reaches the UNet, and backends this device lacks are refused with the reason."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers.models.attention_processor import AttnProcessor, SlicedAttnProcessor

from sdperf.config.architectures import get as get_arch
from sdperf.measure.drift import relative_error
from sdperf.core.errors import ConfigError
from sdperf.experiments import attention as ex
from sdperf.model.generation import Workload, generate
from sdperf.optimizations import attention as opt
from sdperf.model.pipelines import build_pipeline

# Different kernels sum in different orders: float32 rounding, compounded over the denoising steps.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def workload(smoke):
    return Workload.from_profile(smoke, batch_size=1, steps=2)


@pytest.fixture(scope="module")
def reference(tiny_pipe, workload):
    return generate(tiny_pipe, workload)


def drift(pipe, workload, reference) -> float:
    return relative_error(generate(pipe, workload).latents, reference.latents)


def test_cpu_runs_math_and_flash_and_refuses_the_cuda_only_backends():
    for backend in ("math", "flash"):
        ok, reason = opt.sdpa_availability("cpu", backend, "float32", [(8, 40)])
        assert ok, reason
    for backend in ("efficient", "cudnn"):
        ok, reason = opt.sdpa_availability("cpu", backend, "float32", [(8, 40)])
        assert not ok and "cpu float32" in reason and "No viable backend" in reason


def test_cuda_backends_are_not_applicable_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, reason = opt.sdpa_availability("cuda", "flash", "float16")
    assert not ok and "CUDA is not available" in reason


def test_bad_names_are_refused_with_the_choices(tiny_pipe):
    with pytest.raises(ValueError, match="'xformers'.*math, flash, efficient, cudnn"):
        opt.sdpa_availability("cpu", "xformers")
    with pytest.raises(ValueError, match="'float64'.*float32"):
        opt.sdpa_availability("cpu", "math", "float64")
    with pytest.raises(ValueError, match="'vanilla'.*classic, sdpa"):
        opt.use_processor(tiny_pipe, "vanilla")
    with pytest.raises(ValueError, match="'half'.*auto, max"):
        opt.use_slicing(tiny_pipe, "half")
    study = SimpleNamespace(device="cpu", profile=SimpleNamespace(dtype="float32", arch="tiny"))
    with pytest.raises(ConfigError, match="'nope'.*native"):
        ex.configs(study, ["attention:classic", "attention:dispatcher:nope"])


def test_configs_are_catalog_keys_in_the_profiles_precision():
    half = SimpleNamespace(profile=SimpleNamespace(dtype="float16"))
    assert ex.configs(half, ["attention:sdpa:math"]) == [
        ("SDPA math only, float16", "precision:float16+attention:sdpa:math")]
    full = SimpleNamespace(profile=SimpleNamespace(dtype="float32"))
    assert ex.configs(full, ["attention:classic"]) == [("classic (AttnProcessor)", "attention:classic")]


def test_head_shapes_come_from_the_real_architecture_without_weights():
    assert opt.head_shapes(opt.unet_skeleton(get_arch("sd15").unet)) == [(8, 40), (8, 80), (8, 160)]
    assert opt.head_shapes(opt.unet_skeleton(get_arch("tiny").unet)) == [(8, 8)]


def test_dispatcher_does_not_reach_the_sd_unet():
    ok, reason = opt.dispatcher_availability(opt.unet_skeleton(get_arch("tiny").unet))
    assert not ok and "none of the UNet's 12 attention layers" in reason and "AttnProcessor2_0" in reason


def test_classic_processor_keeps_the_picture(smoke, workload, reference):
    pipe = opt.use_processor(build_pipeline(smoke), "classic")
    assert all(isinstance(m.processor, AttnProcessor) for m in opt.attention_modules(pipe.unet))
    assert not any(isinstance(m.processor, AttnProcessor) for m in opt.attention_modules(pipe.vae))  # UNet only
    assert drift(pipe, workload, reference) < TOLERANCE


def test_sliced_attention_keeps_the_picture(smoke, workload, reference):
    pipe = opt.use_slicing(build_pipeline(smoke), "auto")
    assert all(isinstance(m.processor, SlicedAttnProcessor) for m in opt.attention_modules(pipe.unet))
    assert drift(pipe, workload, reference) < TOLERANCE


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_each_cpu_backend_keeps_the_picture(smoke, workload, reference, backend):
    pipe = opt.use_sdpa_backend(build_pipeline(smoke), backend)
    assert opt.facts(pipe)["unet_sdpa_backend"] == backend
    assert drift(pipe, workload, reference) < TOLERANCE


def test_the_restriction_reaches_the_unet_call(smoke, workload):
    """Forcing a backend this CPU lacks must make the UNet's attention fail: proof the context is in force."""
    pipe = opt.use_sdpa_backend(build_pipeline(smoke), "efficient")
    with pytest.raises(RuntimeError, match="No viable backend"):
        generate(pipe, workload)
