"""Exported engines on the tiny UNet: ONNX Runtime and OpenVINO f32 match eager, bf16 says what it did, TensorRT
says why it cannot run without CUDA, bad names fail clearly, exported files are cached whole and loaded back."""
from __future__ import annotations

import math

import pytest
import torch

from sdperf.measure import drift
from sdperf.model.generation import Workload, generate
from sdperf.optimizations import engine_export, openvino_engine, tensorrt_engine
from sdperf.optimizations.unet_graph import EngineUNet, example_inputs

F32_REL_TOL = 1e-4  # fp32 engines reorder and fuse float ops: ~1e-6 here; 1e-4 leaves room, a wrong graph is ~1
BF16_REL_BOUND = 0.1  # bf16 keeps 8 mantissa bits: ~1e-2 relative drift per forward is expected, 0.1 is broken


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return drift.relative_error(out, ref)


def _eager(unet, x, t, ctx) -> torch.Tensor:
    with torch.inference_mode():
        return unet(x, t, encoder_hidden_states=ctx, return_dict=False)[0]


@pytest.fixture(scope="module")
def ort_pipe(smoke, tmp_path_factory):
    """A fresh tiny pipeline whose UNet is ONNX Runtime (dynamo export), built once for the module."""
    from sdperf.model.pipelines import build_pipeline

    scratch = tmp_path_factory.mktemp("scratch")
    pipe = engine_export.apply(build_pipeline(smoke), "onnxruntime-fp32", batch=2, latent_size=smoke.latent_size,
                               scratch_root=scratch)
    return pipe, scratch


@pytest.fixture(scope="module")
def ov_model(tiny_pipe, smoke):
    return openvino_engine.convert(tiny_pipe.unet, example_inputs(tiny_pipe.unet.config, 2, smoke.latent_size))


def test_onnxruntime_generation_matches_eager_and_cleans_up(ort_pipe, tiny_pipe, smoke):
    pipe, scratch = ort_pipe
    unet = pipe.unet
    assert unet.dtype == torch.float32 and unet.device == torch.device("cpu")
    # diffusers adds private keys (_class_name, _diffusers_version) once a config has been serialised
    public = lambda config: {k: v for k, v in dict(config).items() if not k.startswith("_")}  # noqa: E731
    assert public(unet.config) == public(tiny_pipe.unet.config)
    assert unet.facts["exporter"] == "dynamo" and unet.facts["dynamic_batch"] is True
    # the exported graph sits, complete, in the run's artefact cache, and no half-built folder is left beside it
    built = list(scratch.iterdir())
    assert [p.name.split("-")[0] for p in built] == ["onnx"] and (built[0] / "artefact.json").is_file()
    assert unet.facts["artefact"] == "exported into the run's cache" and unet.facts["export_s"] > 0
    w = Workload.from_profile(smoke, batch_size=1)
    assert _rel(generate(pipe, w).latents, generate(tiny_pipe, w).latents) < F32_REL_TOL


def test_a_later_worker_loads_the_cached_engine_instead_of_exporting(ort_pipe, smoke):
    from sdperf.model.pipelines import build_pipeline

    pipe, scratch = ort_pipe
    again = engine_export.apply(build_pipeline(smoke), "onnxruntime-fp32", batch=2, latent_size=smoke.latent_size,
                                scratch_root=scratch).unet
    assert again.facts["artefact"] == "loaded from the run's cache" and again.facts["export_s"] == 0.0
    assert len(list(scratch.iterdir())) == 1
    x, t, ctx = example_inputs(again.config, 2, smoke.latent_size)
    assert torch.equal(again(x, t, encoder_hidden_states=ctx)[0], pipe.unet(x, t, encoder_hidden_states=ctx)[0])


def test_openvino_ir_is_cached_and_read_back_unchanged(tiny_pipe, smoke, tmp_path):
    example = example_inputs(tiny_pipe.unet.config, 2, smoke.latent_size)
    first = openvino_engine.build(tiny_pipe.unet, example, scratch_root=tmp_path)
    second = openvino_engine.build(tiny_pipe.unet, example, scratch_root=tmp_path)
    assert first.facts["artefact"] == "converted into the run's cache"
    assert second.facts["artefact"] == "loaded from the run's cache"
    # the engine read from disk owns its weights: it must not hold the torch UNet's 3.4 GB (SD 1.5) besides
    assert not any(isinstance(k, torch.nn.Module) for k in second._keep)
    assert any(isinstance(k, torch.nn.Module) for k in first._keep)  # a converted model shares them
    assert (tmp_path / "openvino-model-cache").is_dir()  # the plugin's compiled blobs
    x, t, ctx = example
    assert _rel(second(x, t, encoder_hidden_states=ctx)[0], _eager(tiny_pipe.unet, x, t, ctx)) < F32_REL_TOL


def test_onnxruntime_dynamic_batch_and_scheduler_timestep(ort_pipe, tiny_pipe, smoke):
    """One export serves UNet batch 8 (batch 4 with guidance); an int64 timestep as the scheduler gives it."""
    unet = ort_pipe[0].unet
    x, _, ctx = example_inputs(unet.config, 8, smoke.latent_size)
    t = torch.tensor(981)
    out = unet(x, t, encoder_hidden_states=ctx, return_dict=False)
    assert isinstance(out, tuple) and isinstance(out[0], torch.Tensor)
    assert _rel(out[0], _eager(tiny_pipe.unet, x, t, ctx)) < F32_REL_TOL
    with pytest.raises(ValueError, match="added_cond_kwargs"):
        unet(x, t, encoder_hidden_states=ctx, added_cond_kwargs={})


def test_openvino_f32_matches_eager(ov_model, tiny_pipe, smoke):
    compiled, used = openvino_engine.compile_model(ov_model, "f32")
    assert used == "f32"
    x, t, ctx = example_inputs(tiny_pipe.unet.config, 4, smoke.latent_size)
    out = torch.from_numpy(compiled([x.numpy(), t.numpy(), ctx.numpy()])[0])
    assert _rel(out, _eager(tiny_pipe.unet, x, t, ctx)) < F32_REL_TOL


def test_openvino_bf16_reports_its_drift_or_why_it_cannot_run(ov_model, tiny_pipe, smoke):
    """Where the CPU has bf16 the drift is finite and bounded; elsewhere availability says so and compiling
    refuses, rather than timing f32 under a bf16 label."""
    ok, reason = openvino_engine.availability("cpu", "bf16")
    if "BF16" in openvino_engine.capabilities():
        assert ok, reason
        compiled, used = openvino_engine.compile_model(ov_model, "bf16")
        assert used == "bf16"
        x, t, ctx = example_inputs(tiny_pipe.unet.config, 2, smoke.latent_size)
        err = _rel(torch.from_numpy(compiled([x.numpy(), t.numpy(), ctx.numpy()])[0]),
                   _eager(tiny_pipe.unet, x, t, ctx))
        assert math.isfinite(err) and 0 < err < BF16_REL_BOUND
    else:
        assert not ok and "OPTIMIZATION_CAPABILITIES" in reason and "bf16" in reason
        with pytest.raises(RuntimeError, match="f32 although bf16"):
            openvino_engine.compile_model(ov_model, "bf16")


def test_openvino_default_precision_is_read_from_the_compiled_model(ov_model):
    _, used = openvino_engine.compile_model(ov_model, "default")
    assert used == openvino_engine.default_precision() and used in openvino_engine.PRECISIONS


def test_tensorrt_is_not_applicable_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cpu", "cuda"):
        ok, reason = engine_export.availability(device, "tensorrt-fp16")
        assert not ok and "CUDA" in reason and "torch.cuda.is_available() is False" in reason


def test_tensorrt_without_its_package_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", None)  # import tensorrt -> ImportError
    ok, reason = tensorrt_engine.availability("cuda")
    assert not ok and "tensorrt" in reason and "not installed" in reason
    assert not tensorrt_engine.availability("cpu")[0]


def test_cpu_engines_say_why_not_on_cuda():
    for name in ("onnxruntime-fp32", "openvino-f32"):
        ok, reason = engine_export.availability("cuda", name)
        assert not ok and "cuda" in reason


def test_bad_names_list_the_valid_ones(ov_model):
    with pytest.raises(ValueError, match="choose one of: .*openvino-bf16.*tensorrt-fp16"):
        engine_export.parse("openvino-fp64")
    with pytest.raises(ValueError, match="choose one of: f32, bf16, f16, default"):
        openvino_engine.compile_model(ov_model, "bf61")
    with pytest.raises(ValueError, match="choose one of: dynamo, torchscript"):
        engine_export.build(None, "onnxruntime-fp32", batch=2, latent_size=32, exporter="jit")
    assert engine_export.parse("openvino-f32-static") == engine_export.EngineSpec("openvino", "f32", True)


def test_tensorrt_profile_spans_the_batch_range_and_skips_the_scalar_timestep(smoke):
    """The optimization profile TensorRT is built with: (min, opt, max) UNet batch on the batched inputs only."""
    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            self.shapes[name] = (lo, opt, hi)

    class Builder:
        def create_optimization_profile(self):
            return Profile()

    config = type("Config", (), {"in_channels": 4, "cross_attention_dim": 768})
    profile = tensorrt_engine._profile(Builder(), example_inputs(config, 2, smoke.latent_size), (2, 4, 8))
    latent = smoke.latent_size
    assert profile.shapes == {
        "sample": ((2, 4, latent, latent), (4, 4, latent, latent), (8, 4, latent, latent)),
        "encoder_hidden_states": ((2, 77, 768), (4, 77, 768), (8, 77, 768))}


def test_an_engine_stacks_on_a_half_precision_pipeline(smoke, tmp_path):
    """precision:bfloat16 + engine:openvino-bf16 (the ladder's pick on a bf16 CPU): the engine traces a float32 copy
    of the bf16 UNet and hands its output back in the loop's dtype, so the bf16 VAE decodes it; the images stay
    close to the bf16 pipeline's own."""
    from sdperf.optimizations.catalog import Context, Stack
    from sdperf.model.pipelines import build_pipeline

    stack = Stack.of("precision:bfloat16+engine:openvino-f32")  # f32 execution: the drift is the weights' alone
    ctx = Context(smoke, artefacts=tmp_path)
    workload = Workload.from_profile(smoke, batch_size=1)
    half = Stack.of("precision:bfloat16").apply(build_pipeline(smoke), ctx)
    reference = generate(half, workload).images
    pipe = stack.apply(build_pipeline(smoke), ctx)
    assert pipe.vae.dtype == torch.bfloat16 and isinstance(pipe.unet, EngineUNet)
    out = generate(pipe, workload).images
    assert out.shape == reference.shape and torch.isfinite(out).all()
    assert drift.psnr(out, reference) > 30  # bf16 arithmetic in the eager loop vs f32 in the engine
