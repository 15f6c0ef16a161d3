"""int8 on the tiny pipeline: bounded drift, honest availability answers, clear errors, the Amdahl arithmetic."""
from __future__ import annotations

import math

import pytest
import torch

from sdperf.measure import drift
from sdperf.core.errors import ConfigError
from sdperf.experiments import quantization as qx
from sdperf.model.generation import generate, initial_latents
from sdperf.optimizations import quantization as opt
from sdperf.model.pipelines import build_pipeline
from sdperf.measure.roofline import fit_size

# Measured on the tiny network with random weights (4 PLMS steps): latent error about 8e-3, PSNR about 56 dB.
# The bounds leave room for other int8 kernels (VNNI, AMX) rounding differently, and fail on a broken scheme.
MAX_LATENT_REL_ERROR = 0.05
MIN_PSNR_DB = 35.0


def test_torch_ao_dynamic_drift_is_finite_and_bounded(smoke, workload, reference):
    pipe = build_pipeline(smoke)
    linears = sum(isinstance(m, torch.nn.Linear) for m in pipe.unet.modules())
    pipe = opt.apply(pipe, "torch-ao-dynamic")
    counts = opt.module_counts(pipe.unet)
    assert counts.get("DynamicQuantizedLinear") == linears and "Linear" not in counts
    d = drift.compare(generate(pipe, workload), reference)
    assert 0 < d["latent_rel_error"] < MAX_LATENT_REL_ERROR and math.isfinite(d["latent_rel_error"])
    assert MIN_PSNR_DB < d["image_psnr_db"] < math.inf


@pytest.mark.parametrize("scheme,module", [("torchao-int8-dynamic", "torchao"), ("openvino-nncf-weights", "nncf"),
                                           ("openvino-nncf-ptq", "nncf"), ("openvino-nncf-hybrid", "nncf"),
                                           ("openvino-nncf-hybrid", "openvino")])
def test_missing_package_is_not_applicable_with_its_reason(monkeypatch, scheme, module):
    monkeypatch.setattr(opt, "installed", lambda name: name != module)
    ok, reason = opt.availability("cpu", scheme)
    assert not ok and reason == f"{module} is not installed"


def test_availability_on_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(opt, "installed", lambda name: True)
    assert opt.availability("cuda", "torch-ao-dynamic") == (
        False, "torch.ao dynamic quantization has CPU kernels only (fbgemm/oneDNN); torchao is the CUDA path")
    assert not opt.availability("cuda", "openvino-nncf-ptq")[0]
    ok, reason = opt.availability("cuda", "torchao-int8-dynamic")
    assert ok and "cuBLASLt" in reason


def test_torchao_on_cpu_says_whether_int_mm_has_a_kernel(monkeypatch):
    monkeypatch.setattr(opt, "installed", lambda name: True)
    monkeypatch.setattr(opt, "cpu_isa", lambda: {"avx2": True})
    ok, reason = opt.availability("cpu", "torchao-int8-dynamic")
    assert ok and "scalar reference loop" in reason and not opt.native_int_mm("cpu")
    monkeypatch.setattr(opt, "cpu_isa", lambda: {"avx512_vnni": True})
    ok, reason = opt.availability("cpu", "torchao-int8-dynamic")
    assert ok and "oneDNN with avx512_vnni" in reason and opt.native_int_mm("cpu")


def test_bad_scheme_names_the_choices(tiny_pipe):
    with pytest.raises(ValueError, match=r"scheme 'int4' is not valid; choose one of: torch-ao-dynamic, torchao"):
        opt.availability("cpu", "int4")
    with pytest.raises(ValueError, match="'fp8'.*openvino-nncf-ptq"):
        opt.apply(tiny_pipe, "fp8")
    with pytest.raises(ValueError, match="needs the workload"):
        opt.apply(tiny_pipe, "openvino-nncf-ptq")
    with pytest.raises(ConfigError, match="'int8:int4'"):
        qx.check(["int8:torch-ao-dynamic", "int8:int4"])
    with pytest.raises(ValueError, match="not an int8 scheme"):
        qx.check(["precision:float16"])
    assert qx.scheme("int8:openvino-nncf-ptq") == "openvino-nncf-ptq"


def test_torchao_over_budget_is_a_skipped_row_not_a_run(monkeypatch, scratch_reports):
    from types import SimpleNamespace

    import pandas as pd

    from sdperf.measure.comparison import COLUMNS
    from sdperf.store.results import read_results
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="test_quantization")
    ran = []
    monkeypatch.setattr(qx, "run_variants", lambda _study, keys: ran.extend(keys) or SimpleNamespace(
        table=pd.DataFrame(columns=COLUMNS)))
    monkeypatch.setattr(qx, "_torchao_too_slow", lambda *a: "its scalar kernel would take 999 s")
    monkeypatch.setattr(opt, "availability", lambda device, scheme: (True, "stub"))
    cmp = qx.compare_schemes(study, ["int8:torch-ao-dynamic", "int8:torchao-int8-dynamic"], {}, pd.DataFrame())
    assert ran == ["int8:torch-ao-dynamic"]
    row = cmp.table.set_index("variant").loc["int8:torchao-int8-dynamic"]
    assert row["status"] == "skipped" and "999 s" in row["note"]
    rows = read_results("smoke")
    assert (rows[rows.notebook == "test_quantization"].status == "skipped").any()


def test_calibration_inputs_are_every_unet_call_of_one_generation(tiny_pipe, workload):
    inputs = opt.unet_inputs(tiny_pipe, workload)
    assert len(inputs) == workload.steps + 1  # PLMS evaluates its first timestep twice
    sample, t, embeds = inputs[0]
    latents = initial_latents(tiny_pipe, workload)
    assert sample.shape == (2, *latents.shape[1:]) and t.shape == () and embeds.shape[0] == 2
    assert inputs[-1][1] < inputs[0][1]  # timesteps descend along the trajectory


def test_linear_flops_and_the_amdahl_ceiling():
    flops, n = qx._linear_flops(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)),
                                torch.randn(3, 5, 8))
    assert n == 2 and flops == 2 * 15 * (8 * 16 + 16 * 4)
    assert qx.amdahl_bound(0.0, 4.0) == 1.0 and qx.amdahl_bound(100.0, 4.0) == pytest.approx(4.0)
    assert qx.amdahl_bound(25.0, 2.0) == pytest.approx(1 / (0.75 + 0.125))


def test_fit_size_halves_until_one_call_fits():
    calls = []

    def make(n):
        calls.append(n)
        return lambda: sum(range(50_000))  # the probe's cost stands in for any kernel

    assert fit_size(make, 4096, call_budget_s=1e9) == 4096
    assert fit_size(make, 4096, call_budget_s=0.0) == 128
    assert set(calls) == {128}  # only the probe size is ever run


def test_openvino_nncf_weights_is_a_drop_in_unet(smoke, workload, reference):
    pytest.importorskip("nncf")
    pipe = opt.apply(build_pipeline(smoke), "openvino-nncf-weights", workload=workload, prompts=("a cat", "a dog"))
    facts = pipe.unet.facts
    assert facts["nncf_step"] == "compress_weights" and pipe.unet.config.in_channels == 4
    # weights only: no calibration whatever captions are offered, no activation quantizers, int8 weights stored
    assert (facts["calibration_captions"], facts["calibration_inputs"], facts["fake_quantize_nodes"]) == (0, 0, 0)
    assert facts["int8_constants"] > 0
    d = drift.compare(generate(pipe, workload), reference)
    assert 0 < d["latent_rel_error"] < MAX_LATENT_REL_ERROR and d["image_psnr_db"] > MIN_PSNR_DB


def test_a_quantized_irs_cache_key_is_the_same_in_every_process(tiny_pipe, workload, monkeypatch, tmp_path):
    """diffusers lists the config values it defaulted (`_use_default_values`) in set order, which Python's hash seed
    changes from one process to the next: a key holding that order named one calibrated IR two ways, and a second
    run quantized again what the first had cached. Here the two orders two processes may see give one key."""
    import copy
    import json

    from diffusers.configuration_utils import FrozenDict

    from sdperf.optimizations import openvino_engine

    config = dict(tiny_pipe.scheduler.config)
    defaulted = list(config.get("_use_default_values") or ())
    assert len(defaulted) >= 2  # else there is no order to vary, and this test would prove nothing
    keys = []

    class Stop(Exception):
        pass

    def record(*args, key=None, **kwargs):  # the artefact's name is made from `key`: stop before converting
        keys.append(json.dumps(key, sort_keys=True, default=str))
        raise Stop

    monkeypatch.setattr(openvino_engine, "ir_model", record)
    for order in (defaulted, defaulted[::-1]):
        scheduler = copy.copy(tiny_pipe.scheduler)
        scheduler._internal_dict = FrozenDict({**config, "_use_default_values": order})
        monkeypatch.setattr(tiny_pipe, "scheduler", scheduler)
        with pytest.raises(Stop):
            opt.openvino_nncf(tiny_pipe, workload, "openvino-nncf-ptq", scratch_root=tmp_path)
    assert len(keys) == 2 and keys[0] == keys[1]
    assert type(tiny_pipe.scheduler).__name__ in keys[0]  # the scheduler's class is in the key, its values too
