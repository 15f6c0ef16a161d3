"""OpenVINO's own GEMM roofs: the int8 graph really runs an int8 kernel and computes the fake-quantized product,
f32 computes the plain one, and each executor is measured against the roof of the precision it computes in."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sdperf.core import environment
from sdperf.measure import roofline
from sdperf.experiments import quantization as qx
from sdperf.optimizations import catalog, openvino_engine
from sdperf.optimizations import quantization as opt

SIZE = 256


def _need(precision: str) -> None:
    pytest.importorskip("openvino")
    ok, reason = roofline.openvino_availability(precision)
    if not ok:
        pytest.skip(f"OpenVINO cannot run {precision} on this CPU: {reason}")


def _fake_quantized_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """numpy's own int8 product: activations on 256 u8 steps over [0, ACTIVATION_HIGH], weights on symmetric s8
    steps of max|w| / 127, rounded half to even in float32 as the plugin's FakeQuantize does."""
    step_x = roofline.ACTIVATION_HIGH / 255
    step_w = np.abs(w).max() / 127
    xq = np.clip(np.round(x * np.float32(1 / step_x)), 0, 255).astype(np.float64)
    wq = np.clip(np.round(w.astype(np.float64) / step_w), -128, 127)
    return (xq @ wq) * step_x * step_w


def test_int8_matmul_runs_an_int8_kernel_and_computes_the_fake_quantized_product():
    _need("int8")
    mm = roofline.openvino_matmul(SIZE, "int8")
    kernel = mm.kernel()
    assert kernel["runtime_precision"] in ("u8", "i8"), kernel
    assert kernel["layer_type"] in roofline.GEMM_LAYERS and not kernel["primitive_type"].startswith("unknown")
    out = np.array(mm(), dtype=np.float64)
    ref = _fake_quantized_product(mm.x, mm.w)
    exact = mm.x.astype(np.float64) @ mm.w.astype(np.float64)
    quantization_error = np.abs(ref - exact).max()
    # one activation rounded to the other side of a half step moves an output by at most 128 weight steps
    flip = 128 * roofline.ACTIVATION_HIGH / 255 * np.abs(mm.w).max() / 127
    err = np.abs(out - ref)
    assert np.median(err) < 1e-5 * np.abs(ref).max()  # int32 accumulation: exact but for the final f32 scale
    isa = environment.cpu_isa()
    if isa.get("avx512_vnni") or isa.get("avx_vnni") or isa.get("amx_int8"):
        assert err.max() <= 2 * flip and err.max() < 0.1 * quantization_error, (err.max(), quantization_error)
    else:  # AVX2 without VNNI: u8 x s8 pairs are summed in int16 (vpmaddubsw), which saturates. Measured on an AVX2
        # EPYC: jit_gemm_I8, 0.21% of 256x256 outputs off by up to 3.2, twice the quantization error; the rest exact
        assert (err > 2 * flip).mean() < 0.01, (err > 2 * flip).mean()
    assert np.abs(out - exact).max() > 0.5 * quantization_error  # it did quantize: not the f32 product


def test_int8_roof_is_a_positive_rate_with_its_kernel():
    _need("int8")
    roof = roofline.openvino_matmul_peak(SIZE, "int8", min_run_time=0.2)
    assert roof.ops_per_s > 0 and roof.gops == pytest.approx(2 * SIZE**3 / roof.timing.median / 1e9)
    assert roof.runtime_precision in ("u8", "i8") and roof.primitive_type in roof.note()
    assert roof.inference_precision == "f32"  # compiled as the NNCF executor is: the int8 kernel is the only one


def test_f32_matmul_matches_numpy():
    _need("f32")
    mm = roofline.openvino_matmul(SIZE, "f32", seed=3)
    assert mm.kernel()["runtime_precision"] == "f32"
    exact = mm.x.astype(np.float64) @ mm.w.astype(np.float64)
    np.testing.assert_allclose(np.array(mm(), dtype=np.float64), exact, rtol=0, atol=1e-5 * np.abs(exact).max())


def test_a_kernel_in_the_wrong_precision_is_an_error_not_a_roof(monkeypatch):
    _need("int8")
    monkeypatch.setattr(roofline, "gemm_kernel", lambda compiled: {
        "layer_type": "FullyConnected", "runtime_precision": "f32", "primitive_type": "gemm_mlas_f32"})
    with pytest.raises(RuntimeError, match=r"int8 MatMul as FullyConnected in f32 \(gemm_mlas_f32\), not in u8/i8"):
        roofline.openvino_matmul_peak(32, "int8", min_run_time=0.01)


def test_bad_arguments_name_the_valid_ones():
    with pytest.raises(ValueError, match=r"'int4' is not valid; choose one of: f32, bf16, int8"):
        roofline.openvino_availability("int4")
    with pytest.raises(ValueError, match="positive integer, got 0"):
        roofline.openvino_matmul(0, "f32")
    with pytest.raises(ValueError, match=r"\(4, 3\) @ \(4, 3\) do not chain"):
        roofline.openvino_matmul_model(np.zeros((4, 3)), np.zeros((4, 3)), "f32")


@pytest.mark.parametrize("key,roof", [
    ("int8:openvino-nncf-ptq", qx.OV_INT8),        # int8 activations and weights: the u8s8 kernel
    ("int8:openvino-nncf-weights", qx.OV_F32),     # int8 weights decompressed: f32 compute
    ("int8:openvino-nncf-ptq-sq", qx.OV_INT8),     # PTQ with smoothed activations: still int8 x int8
    ("int8:openvino-nncf-ptq-mixed", qx.OV_INT8),  # PTQ with a few layers in float: the rest int8 x int8
    ("int8:torch-ao-dynamic", "quantized linear_dynamic"),
    ("fp32-eager", qx.FP32_ROOF),
    ("engine:openvino-f32-static", qx.OV_F32),
    ("engine:openvino-bf16", "openvino MatMul bf16"),
    ("engine:openvino-default", None),             # the plugin picks its precision: no single roof
])
def test_each_executor_gets_the_roof_of_its_precision(key, roof):
    assert qx.roof_kernel(key) == roof


INT8_KEYS = [k for k in catalog.keys() if k.startswith("int8:")]
# every roof 08's int8_roofs measures (OpenVINO's on a CPU)
MEASURED = {qx.FP32_ROOF, opt.INT_MM, opt.LINEAR_DYNAMIC, *openvino_engine.ROOFS.values()}


@pytest.mark.parametrize("key", INT8_KEYS)
def test_every_int8_scheme_is_held_against_the_measured_roof_its_record_names(key):
    assert len(INT8_KEYS) == len(opt.SCHEMES)
    assert qx.roof_kernel(key) == catalog.get(key).roof_kernel == opt.SCHEMES[qx.scheme(key)].roof_kernel
    assert qx.roof_kernel(key) in MEASURED


def test_notebook_08_runs_ptq_alternatives_on_smoke():
    """nbval runs 08 on the smoke profile, whose schemes are its techniques of 08: two of them are calibrated PTQ
    alternatives, so the notebook's availability, comparison and roofline cells run on them whole."""
    from sdperf.config.profiles import load_profile
    from sdperf.experiments.common import profile_keys

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "08_quantization.ipynb"
    import nbformat

    code = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
    assert 'profile_keys(profile, schemes, "08_quantization")' in code
    schemes = profile_keys("smoke", None, opt.NOTEBOOK)
    assert schemes == catalog.among(load_profile("smoke", check_runtime=False).techniques, opt.NOTEBOOK)
    assert {"int8:openvino-nncf-ptq-sq", "int8:openvino-nncf-ptq-mixed"} <= set(qx.check(schemes))


def _roofs() -> pd.DataFrame:
    return pd.DataFrame([
        {"kernel": qx.FP32_ROOF, "dtype": "float32", "size": 64, "gops": 100.0, "primitive": None},
        {"kernel": "quantized linear_dynamic", "dtype": "int8", "size": 64, "gops": 200.0, "primitive": None},
        {"kernel": qx.OV_F32, "dtype": "float32", "size": 64, "gops": 125.0, "primitive": "gemm_mlas_f32"},
        {"kernel": qx.OV_INT8, "dtype": "int8", "size": 64, "gops": 1000.0, "primitive": "brgemm_avx512_amx_I8"}])


def _cmp(rows: list[tuple]) -> SimpleNamespace:
    cols = ["variant", "key", "status", "unet_step_s", "unet_step_speedup", "unet_step_speedup_lo",
            "unet_step_speedup_hi", "rounds", "method"]
    table = pd.DataFrame([(v, k, "ok", s, x, lo, hi, 3, "rounds") for v, k, s, x, lo, hi in rows], columns=cols)
    return SimpleNamespace(ok=lambda: table)


def test_roofline_shares_and_the_issue_15_goal(scratch_reports):
    from sdperf.store.results import read_results
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="test_int8_roof")
    cmp = _cmp([("fp32 eager", "fp32-eager", 2.0, 1.0, 1.0, 1.0),
                ("int8:openvino-nncf-weights", "int8:openvino-nncf-weights", 1.0, 2.0, 1.9, 2.1),
                ("int8:openvino-nncf-ptq", "int8:openvino-nncf-ptq", 0.25, 8.5, 6.0, 9.0),
                ("int8:torch-ao-dynamic", "int8:torch-ao-dynamic", 1.9, 1.05, 1.0, 1.1)])
    share = {"unet_flops": 100e9, "linear_share_percent": 20.0}
    line = qx.roofline(study, cmp, share, _roofs()).set_index("variant")
    goal = 0.8 * 1000.0 / 100.0  # 80% of OpenVINO int8 over torch.mm fp32
    assert line.loc["fp32 eager", "roof_kernel"] == qx.FP32_ROOF
    assert line.loc["fp32 eager", "percent_of_roof"] == pytest.approx(100 * 50 / 100)
    weights, ptq = line.loc["int8:openvino-nncf-weights"], line.loc["int8:openvino-nncf-ptq"]
    assert weights["roof_kernel"] == qx.OV_F32 and weights["percent_of_roof"] == pytest.approx(100 * 100 / 125)
    assert pd.isna(weights["goal_x"])  # computes in f32: no int8 goal
    assert ptq["roof_kernel"] == qx.OV_INT8 and ptq["percent_of_roof"] == pytest.approx(100 * 400 / 1000)
    assert ptq["goal_x"] == pytest.approx(goal) and ptq["goal_met"] and not ptq["goal_met_every_round"]
    ao = line.loc["int8:torch-ao-dynamic"]
    assert ao["goal_x"] == pytest.approx(goal) and not ao["goal_met"]
    assert ao["linear_only_ceiling_x"] == pytest.approx(qx.amdahl_bound(20.0, 2.0))
    assert "reached by the median, not in every round" in qx.goal_summary(line.reset_index())
    rows = read_results("smoke")
    rows = rows[(rows.notebook == "test_int8_roof") & (rows.scenario == "int8:openvino-nncf-ptq, batch 1")]
    got = rows.set_index("metric")
    assert got.loc["unet_step_speedup_goal", "value"] == pytest.approx(goal)
    assert got.loc["unet_step_speedup_goal", "method"].startswith("a target, not a measurement")  # a row names its method
    assert got.loc["percent_of_unet_step_goal", "lo"] == pytest.approx(100 * 6.0 / goal)
    assert "brgemm_avx512_amx_I8" in got.loc["percent_of_roof", "note"]
