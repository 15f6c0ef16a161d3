"""What the field uses instead of plain int8 PTQ (issue 31), on the tiny pipeline: SmoothQuant alphas, calibration on
many captions, sensitive layers kept in float; each checked in the graph NNCF leaves against plain PTQ's graph, and
the rule that judges them only when PTQ alone is over the quality budget."""
from __future__ import annotations

import pandas as pd
import pytest

from sdperf.measure import drift
from sdperf.model.generation import generate
from sdperf.model.pipelines import build_pipeline
from sdperf.optimizations import catalog
from sdperf.optimizations import quantization as opt
from sdperf.judge import techniques
from sdperf.judge.paired import OVER, WITHIN

PTQ = "int8:openvino-nncf-ptq"
CAPTIONS = ("a red square on a white background", "two blue circles", "a green triangle above a yellow line")
MAX_LATENT_REL_ERROR = 0.1  # as for the hybrid scheme (tests/test_nncf_hybrid.py): errors of order 1 mean a bug
MIN_PSNR_DB = 35.0


@pytest.fixture(scope="module")
def quantized(smoke, tmp_path_factory):
    """Each scheme applied as a worker applies it, the plain PTQ among them as the control."""
    pytest.importorskip("nncf")
    scratch, out = tmp_path_factory.mktemp("artefacts"), {}

    def get(key):
        if key not in out:
            ctx = catalog.Context(smoke, batch_size=1, artefacts=scratch, prompts=CAPTIONS)
            out[key] = catalog.get(key).apply(build_pipeline(smoke), ctx), ctx
        return out[key]
    return get


def _model(pipe):
    import openvino as ov

    return next(k for k in pipe.unet._keep if isinstance(k, ov.Model))


def _fed_by_fake_quantize(op) -> bool:
    """Whether a FakeQuantize feeds any input of `op` (through layout ops): its input is rounded to int8."""
    for port in range(op.get_input_size()):
        node = op.input_value(port).get_node()
        while node.get_type_name() in ("Reshape", "Transpose", "Convert", "Unsqueeze", "Squeeze"):
            node = node.input_value(0).get_node()
        if node.get_type_name() == "FakeQuantize":
            return True
    return False


def test_the_alternatives_are_catalog_techniques_and_ptq_names_them_as_its_fallbacks():
    assert catalog.get(PTQ).fallbacks == opt.PTQ_ALTERNATIVES
    for key in opt.PTQ_ALTERNATIVES:
        t = catalog.get(key)
        assert t.family == catalog.EXECUTOR and t.changes_output and not t.fallbacks
    assert all(not catalog.get(k).fallbacks for k in catalog.keys() if k != PTQ)


@pytest.mark.parametrize("key", ["int8:openvino-nncf-ptq-sq", "int8:openvino-nncf-ptq-wide",
                                 "int8:openvino-nncf-ptq-mixed"])
def test_each_alternative_generation_stays_close_to_fp32(quantized, key, workload, reference):
    pipe, ctx = quantized(key)
    d = drift.compare(generate(pipe, workload), reference)
    assert 0 < d["latent_rel_error"] < MAX_LATENT_REL_ERROR and MIN_PSNR_DB < d["image_psnr_db"] < float("inf")
    assert ctx.facts["nncf_step"] == opt.SCHEMES[key.removeprefix("int8:")].nncf_step
    assert ctx.facts["fake_quantize_nodes"]


def test_smoothquant_scales_the_convolutions_only_with_its_alpha_set(quantized):
    plain, sq = _model(quantized(PTQ)[0]), _model(quantized("int8:openvino-nncf-ptq-sq")[0])

    def consumers(op) -> set[str]:
        """The layer types a node feeds, through the quantizer and layout ops NNCF puts between."""
        out = set()
        for t in op.output(0).get_target_inputs():
            node = t.get_node()
            kind = node.get_type_name()
            out |= consumers(node) if kind in ("FakeQuantize", "Convert", "Reshape", "Transpose") else {kind}
        return out

    def smoothed_convolutions(model):
        return [op for op in model.get_ops() if op.get_friendly_name().endswith(opt.SMOOTHING_SUFFIX)
                and "Convolution" in consumers(op)]
    assert not smoothed_convolutions(plain)  # NNCF's default leaves convolutions unsmoothed
    assert smoothed_convolutions(sq)
    assert quantized("int8:openvino-nncf-ptq-sq")[1].facts["smooth_quant_scales"] > \
        quantized(PTQ)[1].facts["smooth_quant_scales"]


def test_mixed_keeps_the_end_convolutions_and_the_attention_products_in_float(quantized):
    plain, mixed = _model(quantized(PTQ)[0]), _model(quantized("int8:openvino-nncf-ptq-mixed")[0])
    for model, kept in ((plain, False), (mixed, True)):
        convs = [op for op in model.get_ordered_ops() if op.get_type_name() == "Convolution"]
        attention = [op for op in model.get_ops() if op.get_type_name() == opt.ATTENTION]
        assert len(convs) > 2 and attention  # the tiny UNet's SDPA converts to OpenVINO's attention op
        ends = [convs[0], convs[-1]]
        assert all(_fed_by_fake_quantize(op) != kept for op in ends), [op.get_friendly_name() for op in ends]
        assert all(_fed_by_fake_quantize(op) != kept for op in attention)  # plain PTQ rounds query and key
        assert any(_fed_by_fake_quantize(op) for op in convs[1:-1])  # the rest is int8 in both


def test_many_captions_take_a_few_calls_of_each_trajectory(quantized, workload):
    _, plain = quantized(PTQ)
    _, wide = quantized("int8:openvino-nncf-ptq-wide")
    calls = workload.steps + 1  # PLMS evaluates its first timestep twice
    assert plain.facts["calibration_inputs"] == len(CAPTIONS) * calls
    assert wide.facts["calibration_captions"] == len(CAPTIONS)
    assert wide.facts["calibration_inputs"] == len(CAPTIONS) * min(calls, opt.WIDE_PER_CAPTION)


def test_spread_keeps_a_trajectorys_ends_and_spaces_the_rest():
    assert opt.spread(list(range(51)), 4) == [0, 17, 33, 50]
    assert opt.spread(list(range(3)), 4) == [0, 1, 2] and opt.spread(list(range(5)), None) == list(range(5))
    with pytest.raises(ValueError, match="at least 2"):
        opt.spread(list(range(10)), 1)


def test_calibration_with_a_few_calls_per_caption_fits_more_captions_in_the_limit(tiny_pipe, workload):
    calls = workload.steps + 1
    whole, used = opt.calibration_set(tiny_pipe, workload, CAPTIONS, limit=calls * 2)
    assert (len(whole), used) == (calls * 2, 2)  # whole trajectories: two captions fit
    few, used = opt.calibration_set(tiny_pipe, workload, CAPTIONS, limit=calls * 2, per_caption=2)
    assert (len(few), used) == (6, 3)  # two calls a caption: all three fit
    assert [float(s[1]) for s in few[:2]] == [float(whole[0][1]), float(whole[calls - 1][1])]


def _overall(rows):
    return pd.DataFrame(rows, columns=["key", "quality_verdict"])


def test_the_fallbacks_are_judged_only_when_ptq_alone_is_over():
    assert techniques.fallbacks(_overall([(PTQ, OVER), ("scheduler:euler@10", OVER)])) == {
        PTQ: list(opt.PTQ_ALTERNATIVES)}  # a technique without fallbacks adds none
    assert techniques.fallbacks(_overall([(PTQ, WITHIN)])) == {}
    assert techniques.fallbacks(_overall([(PTQ, "undecided")])) == {}
    control = techniques.controls.defaults((2.0,))[0].key
    assert techniques.fallbacks(_overall([(control, OVER)])) == {}
    assert techniques.fallbacks(_overall([(f"{PTQ}+scheduler:euler@10", OVER)])) == {}  # not PTQ alone
