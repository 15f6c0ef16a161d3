"""The text encoder and VAE decoder run by OpenVINO (stages:*) on the tiny pipeline: the generation path calls the
stand-ins, f32 keeps the images, int8 weights move them a little, a later worker reads the cached IR, they stack with
a UNet engine, and where they cannot run the reason says why."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.model.generation import Workload, generate, initial_latents
from sdperf.optimizations import catalog, stage_engines
from sdperf.optimizations.catalog import Context, Stack
from sdperf.optimizations.stage_engines import EngineTextEncoder, EngineVAEDecoder
from sdperf.optimizations.unet_graph import EngineUNet

F32, INT8W = "stages:openvino-f32", "stages:openvino-int8w"
# fp32 engines reorder and fuse float ops: the images (in [0, 1]) differ by ~1e-6 here; 1e-4 leaves a hundredfold
# margin, while a wrong graph (a missed post_quant_conv, the pooled output for the hidden state) is off by ~0.1-1
F32_IMAGE_TOL = 1e-4
# int8 weights move the tiny model's images by ~7e-3 at most here: more than f32 reordering ever does (so the
# compression did happen), far less than a broken graph
INT8W_IMAGE_MIN, INT8W_IMAGE_MAX = 1e-4, 0.05


class Counting:
    """Wraps a stand-in's engine and records the input shape of every call."""

    def __init__(self, engine):
        self.engine, self.shapes = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def __call__(self, x):
        self.shapes.append(tuple(x.shape))
        return self.engine(x)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    return tmp_path_factory.mktemp("stage-artefacts")


def _applied(smoke, key: str, artefacts, batch_size: int = 1):
    from sdperf.model.pipelines import build_pipeline

    ctx = Context(smoke, batch_size=batch_size, artefacts=artefacts)
    return Stack.of(key).apply(build_pipeline(smoke), ctx), ctx


def _images(pipe, smoke, batch_size: int = 1):
    w = Workload.from_profile(smoke, batch_size=batch_size)
    return generate(pipe, w, latents=initial_latents(pipe, w)).images


@pytest.fixture(scope="module")
def f32(smoke, artefacts):
    return _applied(smoke, F32, artefacts)


@pytest.fixture(scope="module")
def reference(tiny_pipe, smoke):
    return _images(tiny_pipe, smoke)


def test_the_keys_are_declared_as_stages_of_07_and_timed_whole():
    for key, lossy in ((F32, False), (INT8W, True)):
        tech = catalog.get(key)
        assert (tech.family, tech.notebook, tech.loop_only, tech.changes_output) == (
            catalog.STAGES, "07_engine_export", False, lossy)
    assert not Stack.of(F32).loop_only and not Stack.of(f"engine:openvino-f32+{F32}").loop_only
    with pytest.raises(ConfigError, match="unknown technique 'stages:openvino-bf16'"):
        catalog.get("stages:openvino-bf16")
    with pytest.raises(ValueError, match="choose one of: openvino-f32, openvino-int8w"):
        stage_engines.check_variant("openvino-fp16")


def test_not_applicable_on_cuda_for_sdxl_or_without_its_packages(smoke, monkeypatch):
    ok, reason = catalog.get(F32).availability(Context(replace(smoke, device="cuda")))
    assert not ok and reason == "OpenVINO runs on CPUs (and Intel GPUs); this profile's device is cuda"
    ok, reason = catalog.get(F32).availability(Context(replace(smoke, arch="tiny-sdxl")))
    assert not ok and "SDXL" in reason
    ok, reason = catalog.get(INT8W).availability(Context(smoke))
    assert ok and "int8 weights" in reason and "f32" in reason
    monkeypatch.setattr(stage_engines, "installed", lambda module: module != "nncf")
    assert catalog.get(F32).availability(Context(smoke))[0]
    assert catalog.get(INT8W).availability(Context(smoke)) == (False, "nncf is not installed")
    monkeypatch.setattr(stage_engines, "installed", lambda module: module != "openvino")
    for key in (F32, INT8W):
        assert catalog.get(key).availability(Context(smoke)) == (False, "openvino is not installed")


def test_f32_stages_are_what_the_generation_calls_and_keep_the_images(f32, reference, tiny_pipe):
    pipe, ctx = f32
    text, decoder = pipe.text_encoder, pipe.vae.decoder
    assert isinstance(text, EngineTextEncoder) and isinstance(decoder, EngineVAEDecoder)
    assert isinstance(pipe.vae.post_quant_conv, torch.nn.Identity)  # folded into the decoder's graph
    assert pipe.unet is not None and not isinstance(pipe.unet, EngineUNet)  # the loop is untouched
    # the config as built, less what saving and reloading the session-shared pipeline (another test of this worker,
    # in xdist's order) writes into it: serialization metadata, not the model
    saved = {"architectures", "dtype", "torch_dtype", "transformers_version", "_name_or_path"}
    same = lambda c: {k: v for k, v in c.to_dict().items() if k not in saved}  # noqa: E731
    assert (text.dtype, text.device) == (torch.float32, torch.device("cpu"))
    assert same(text.config) == same(tiny_pipe.text_encoder.config)
    f = ctx.facts
    assert f["text_encoder_shape"] == [1, 77] and f["vae_decoder_shape"] == [1, 4, 32, 32]
    assert f["stages_replaced"] == stage_engines.REPLACED and f["stages_precision"] == f["precision"] == "f32"
    assert f["text_encoder_artefact"] == f["vae_decoder_artefact"] == "converted into the run's cache"
    assert f["export_s"] == f["stages_export_s"] > 0 and f["build_s"] > 0 and f["dynamic_batch"] is False
    err = (_images(pipe, ctx.profile) - reference).abs().max().item()
    assert err < F32_IMAGE_TOL, err


def test_the_generation_calls_each_stand_in_at_its_static_shape(f32, smoke):
    """encode_prompt runs the encoder twice at batch 1 (prompt, empty negative prompt); decode once per batch."""
    pipe, _ = f32
    text, decoder = pipe.text_encoder, pipe.vae.decoder
    seen_text, seen_decoder = Counting(text.engine), Counting(decoder.engine)
    text.engine, decoder.engine = seen_text, seen_decoder
    try:
        _images(pipe, smoke)
    finally:
        text.engine, decoder.engine = seen_text.engine, seen_decoder.engine
    assert seen_text.shapes == [(1, 77), (1, 77)]
    assert seen_decoder.shapes == [(1, 4, 32, 32)]
    assert text.engine.recompiles == decoder.engine.recompiles == 0


def test_a_later_worker_reads_the_cached_ir_and_gets_the_same_images(f32, smoke, artefacts):
    again, ctx = _applied(smoke, F32, artefacts)
    assert ctx.facts["text_encoder_artefact"] == ctx.facts["vae_decoder_artefact"] == "loaded from the run's cache"
    assert ctx.facts["stages_export_s"] == 0.0
    assert torch.equal(_images(again, smoke), _images(f32[0], smoke))


def test_int8_weights_move_the_images_a_little(smoke, artefacts, reference):
    pipe, ctx = _applied(smoke, INT8W, artefacts)
    assert isinstance(pipe.text_encoder, EngineTextEncoder) and isinstance(pipe.vae.decoder, EngineVAEDecoder)
    f = ctx.facts
    assert f["text_encoder_int8_weights"] > 0 and f["vae_decoder_int8_weights"] > 0
    assert f["text_encoder_converted"] == "loaded from the run's cache"  # compressed from the run's plain IR
    assert f["precision"] == "f32" and "int8" in f["stages_weights"]
    err = (_images(pipe, smoke) - reference).abs().max().item()
    assert INT8W_IMAGE_MIN < err < INT8W_IMAGE_MAX, err


def test_the_decoder_is_built_for_the_workloads_image_batch(smoke, artefacts, tiny_pipe):
    """Batch 2: the UNet's guidance batch is 4, the decoder's is the 2 images, the text encoder's stays 1."""
    pipe, ctx = _applied(smoke, F32, artefacts, batch_size=2)
    assert ctx.facts["vae_decoder_shape"] == [2, 4, 32, 32] and ctx.facts["text_encoder_shape"] == [1, 77]
    err = (_images(pipe, smoke, 2) - _images(tiny_pipe, smoke, 2)).abs().max().item()
    assert err < F32_IMAGE_TOL and pipe.vae.decoder.engine.recompiles == 0


def test_stacks_with_a_unet_engine(smoke, artefacts, reference):
    pipe, ctx = _applied(smoke, f"engine:openvino-f32+{F32}", artefacts)
    assert isinstance(pipe.unet, EngineUNet)
    assert isinstance(pipe.text_encoder, EngineTextEncoder) and isinstance(pipe.vae.decoder, EngineVAEDecoder)
    # the UNet engine's set-up facts stay under the generic names, the stages' under their own
    assert ctx.facts["name"] == "openvino-f32" and ctx.facts["dynamic_batch"] is True
    assert ctx.facts["stages_replaced"] == stage_engines.REPLACED
    err = (_images(pipe, smoke) - reference).abs().max().item()
    assert err < F32_IMAGE_TOL, err


def test_a_later_precision_change_reaches_the_text_encoders_output(smoke, artefacts):
    """precision:bfloat16 after the stages (pipe.to): the embeddings must come out in the bf16 UNet's dtype."""
    pipe, _ = _applied(smoke, f"{F32}+precision:bfloat16", artefacts)
    ids = torch.zeros(1, 77, dtype=torch.int64)
    assert pipe.text_encoder.dtype == torch.bfloat16 and pipe.text_encoder(ids)[0].dtype == torch.bfloat16
    z = torch.zeros(1, 4, 32, 32, dtype=torch.bfloat16)
    assert pipe.vae.decoder(z).dtype == torch.bfloat16


def test_the_text_encoder_refuses_what_it_cannot_return(f32):
    text = f32[0].text_encoder
    ids = torch.zeros(1, 77, dtype=torch.int64)
    assert torch.equal(text(ids)[0], text(ids).last_hidden_state)
    assert text(ids, return_dict=False)[0].shape[:2] == (1, 77)
    with pytest.raises(ValueError, match="output_hidden_states"):
        text(ids, output_hidden_states=True)
    with pytest.raises(ValueError, match="attention_mask"):
        text(ids, attention_mask=torch.ones(1, 77))


def test_07_reads_each_stage_against_fp32_at_the_same_moment():
    """A stage's ratio uses fp32 eager interpolated in wall time to the configuration's calls, like every ratio."""
    import pandas as pd

    from sdperf.experiments import engine_export as experiment
    from sdperf.measure.rounds import BASELINE

    def stages(vae, text):
        return [{"stage": "vae_decode", "seconds_per_image_call": vae},
                {"stage": "text_encoder", "seconds_per_image_call": text}]
    raw = pd.DataFrame([
        {"config": BASELINE, "status": "ok", "t_start": 0.0, "t_end": 10.0, "stages": stages(4.0, 0.2)},
        {"config": "staged", "status": "ok", "t_start": 10.0, "t_end": 20.0, "stages": stages(2.5, 0.1)},
        {"config": BASELINE, "status": "ok", "t_start": 20.0, "t_end": 30.0, "stages": stages(6.0, 0.2)}])
    got = experiment._stage_ratio(raw, "staged", "vae_decode")  # the machine slowed: fp32 took 5 s at t=15
    assert got == pytest.approx({"vae_decode_s": 2.5, "vae_decode_s_fp32": 5.0, "vae_decode_speedup": 2.0,
                                 "vae_decode_speedup_lo": 2.0, "vae_decode_speedup_hi": 2.0})
    assert experiment._stage_ratio(raw, "staged", "text_encoder")["text_encoder_speedup"] == pytest.approx(2.0)
    assert experiment.stage_key(F32) == F32
    with pytest.raises(ValueError, match="not a stage engine; give one of: stages:openvino-f32"):
        experiment.stage_key("engine:openvino-f32")
