"""NNCF's hybrid int8 mode and calibration over captions, on the tiny pipeline: the graph NNCF leaves, the drift,
the calibration set (one generation per caption) and the cache key it goes into."""
from __future__ import annotations

import collections
from dataclasses import replace

import pytest
import torch

from sdperf.measure import drift
from sdperf.model.generation import Workload, generate
from sdperf.optimizations import catalog
from sdperf.optimizations import quantization as opt
from sdperf.model.pipelines import build_pipeline

HYBRID = "int8:openvino-nncf-hybrid"
CAPTIONS = ("a red square on a white background", "two blue circles", "a green triangle above a yellow line")
# Measured here (AMX/VNNI CPU, 4 PLMS steps, random weights): hybrid latent error 0.036, image PSNR 44 dB, the same
# as full PTQ (0.036, 43.5 dB) since the tiny UNet's activations are quantized in both; weights-only: 0.006, 59 dB.
# About 3x the measured error and 9 dB under the PSNR leave room for CPUs whose int8 kernels round otherwise (AVX2
# without VNNI); a broken scale or a skipped dequantization gives errors of order 1 and fails.
MAX_LATENT_REL_ERROR = 0.1
MIN_PSNR_DB = 35.0
# Graph ops a weight or activation passes through on its way to a layer (layout and the int8 decompression).
PASS_THROUGH = ("Convert", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Subtract", "Multiply")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("artefacts")


@pytest.fixture(scope="module")
def hybrid(smoke, scratch):
    """The catalog technique applied as a worker applies it: Context with three calibration captions."""
    pytest.importorskip("nncf")
    ctx = catalog.Context(smoke, batch_size=1, artefacts=scratch, prompts=CAPTIONS)
    return catalog.get(HYBRID).apply(build_pipeline(smoke), ctx), ctx


def _ov_model(pipe):
    import openvino as ov

    return next(k for k in pipe.unet._keep if isinstance(k, ov.Model))


def _source(node, through=PASS_THROUGH):
    while node.get_type_name() in through:
        node = node.input_value(0).get_node()
    return node


def _weight_type(op) -> str | None:
    """The element type of the constant a layer's weight input comes from (None: no constant operand)."""
    for port in range(op.get_input_size()):
        src = _source(op.input_value(port).get_node())
        if src.get_type_name() == "Constant":
            return src.get_element_type().get_type_name()
    return None


def _activation_source(op) -> str:
    return _source(op.input_value(0).get_node(), through=("Reshape", "Transpose")).get_type_name()


def test_hybrid_is_a_catalog_technique_with_its_availability(smoke, monkeypatch):
    tech = catalog.get(HYBRID)
    assert (tech.label, tech.family, tech.notebook) == ("OpenVINO + NNCF hybrid int8", catalog.EXECUTOR,
                                                        "08_quantization")
    assert tech.changes_output and tech.loop_only and HYBRID in catalog.keys(notebook="08_quantization")
    ok, reason = tech.availability(catalog.Context(smoke))
    assert (ok, reason) == opt.availability("cpu", "openvino-nncf-hybrid")
    if opt.installed("nncf") and opt.installed("openvino"):
        assert ok and reason.startswith("OpenVINO CPU plugin int8 kernels")
    monkeypatch.setattr(opt, "installed", lambda name: name != "nncf")
    assert tech.availability(catalog.Context(smoke)) == (False, "nncf is not installed")


def test_hybrid_compresses_all_weights_and_quantizes_convolution_activations(hybrid):
    pipe, _ = hybrid
    model = _ov_model(pipe)
    ops = model.get_ops()
    convs = [op for op in ops if op.get_type_name() == "Convolution"]
    matmuls = [op for op in ops if op.get_type_name() == "MatMul" and _weight_type(op) is not None]
    assert convs and matmuls
    # every weight is stored in 8 bits: convolutions quantized (i8), matmuls weight-compressed (u8, asymmetric)
    assert {_weight_type(op) for op in convs} == {"i8"}
    assert {_weight_type(op) for op in matmuls} == {"u8"}
    # activations: a FakeQuantize feeds every convolution; no weighted matmul has one (that would be full PTQ)
    assert collections.Counter(_activation_source(op) for op in convs) == {"FakeQuantize": len(convs)}
    assert not [op.get_friendly_name() for op in matmuls if _activation_source(op) == "FakeQuantize"]
    facts = pipe.unet.facts
    fq = sum(op.get_type_name() == "FakeQuantize" for op in ops)
    assert facts["fake_quantize_nodes"] == fq >= len(convs) and facts["nncf_step"] == opt.SCHEMES[
        "openvino-nncf-hybrid"].nncf_step


def test_hybrid_generation_stays_close_to_fp32(hybrid, workload, reference):
    pipe, _ = hybrid
    d = drift.compare(generate(pipe, workload), reference)
    assert 0 < d["latent_rel_error"] < MAX_LATENT_REL_ERROR
    assert MIN_PSNR_DB < d["image_psnr_db"] < float("inf")


def test_calibration_uses_one_generation_per_caption(hybrid, workload):
    _, ctx = hybrid
    calls = workload.steps + 1  # PLMS evaluates its first timestep twice
    assert ctx.facts["calibration_captions"] == len(CAPTIONS)
    assert ctx.facts["calibration_inputs"] == len(CAPTIONS) * calls


def _stub_nncf(monkeypatch, step) -> None:
    """The hybrid scheme with `step` in place of its NNCF passes."""
    name = HYBRID.removeprefix("int8:")
    monkeypatch.setitem(opt.SCHEMES, name, replace(opt.SCHEMES[name], nncf=step))


def test_calibration_captions_are_in_the_cache_key(smoke, hybrid, scratch, monkeypatch):
    """Another caption set is another IR; the same captions load the fixture's IR. (The single-caption IR's own
    quantization is stubbed: NNCF's passes are the fixture's, and what is checked here is the key, not them.)"""
    def folders():
        return {p.name for p in scratch.glob("nncf-hybrid-*")}

    first = folders()
    assert len(first) == 1
    tech = catalog.get(HYBRID)
    _stub_nncf(monkeypatch, lambda model, data, subset_size: model)
    single = catalog.Context(smoke, batch_size=1, artefacts=scratch)  # no prompts: the profile's prompt
    tech.apply(build_pipeline(smoke), single)
    assert single.facts["calibration_captions"] == 1 and single.facts["artefact"] == "converted into the run's cache"
    both = folders()
    assert len(both) == 2 and first < both
    again = catalog.Context(smoke, batch_size=1, artefacts=scratch, prompts=CAPTIONS)
    tech.apply(build_pipeline(smoke), again)  # the same captions: the first IR, loaded, with its facts
    assert again.facts["artefact"] == "loaded from the run's cache" and folders() == both
    assert again.facts["calibration_inputs"] == hybrid[1].facts["calibration_inputs"]


def test_the_calibration_size_bounds_the_calibration_and_is_in_the_cache_key(smoke, hybrid, scratch, workload,
                                                                             monkeypatch):
    """Context.calibration_samples (a profile's reference_calibration_samples, when judging on the reference model)
    caps the UNet calls collected, in whole generations, is the subset NNCF is given, and an IR calibrated on fewer
    calls is another artefact. (NNCF's own quantization is the fixture's; here it returns the model as it is.)"""
    calls, given = workload.steps + 1, []
    _stub_nncf(monkeypatch, lambda model, data, subset_size: given.append(subset_size) or model)
    before = {p.name for p in scratch.glob("nncf-hybrid-*")}
    one = catalog.Context(smoke, batch_size=1, artefacts=scratch, prompts=CAPTIONS, calibration_samples=calls)
    catalog.get(HYBRID).apply(build_pipeline(smoke), one)
    assert one.facts["calibration_captions"] == 1 and one.facts["calibration_inputs"] == calls and given == [calls]
    assert one.facts["artefact"] == "converted into the run's cache"
    assert len({p.name for p in scratch.glob("nncf-hybrid-*")} - before) == 1
    assert catalog.get(HYBRID).calibrated and not catalog.get("int8:openvino-nncf-weights").calibrated


def test_calibration_set_takes_whole_generations_within_the_limit(tiny_pipe, workload):
    calls = workload.steps + 1
    samples, used = opt.calibration_set(tiny_pipe, workload, CAPTIONS)
    assert (len(samples), used) == (3 * calls, 3)
    embeds = [samples[i * calls][2] for i in range(3)]  # each generation's text embeddings are its own caption's
    assert not torch.equal(embeds[0], embeds[1]) and not torch.equal(embeds[1], embeds[2])
    assert all(torch.equal(samples[i][2], embeds[1]) for i in range(calls, 2 * calls))
    assert [len(opt.calibration_set(tiny_pipe, workload, CAPTIONS, limit=n)[0]) for n in (2 * calls, 1)] == [
        2 * calls, calls]  # never a generation cut short, always at least one
    alone, used = opt.calibration_set(tiny_pipe, workload)
    assert used == 1 and torch.equal(alone[0][2], opt.unet_inputs(tiny_pipe, workload)[0][2])


def test_calibration_captions_and_digest():
    w = Workload("the profile's prompt", 1, 2, 7.5, 64, 64, 0)
    assert opt.calibration_captions((), w) == ("the profile's prompt",)
    assert opt.calibration_captions(list(CAPTIONS), w) == CAPTIONS
    assert opt.captions_digest(CAPTIONS) != opt.captions_digest(CAPTIONS[::-1])
    with pytest.raises(TypeError, match="sequence of captions, not the string 'a cat'"):
        opt.calibration_captions("a cat", w)
    with pytest.raises(ValueError, match=r"non-empty strings; got \[' '\]"):
        opt.calibration_captions(("a cat", " "), w)
    with pytest.raises(ValueError, match="not an OpenVINO scheme; choose one of: openvino-nncf-weights"):
        opt.openvino_nncf(None, w, "torch-ao-dynamic")
