"""Measured generations on the tiny pipeline: stage breakdown, comparison with the baseline, half precision."""
from __future__ import annotations

import pytest
import torch

from sdperf.model.generation import STAGES, Workload
from sdperf.measure.measurements import block_comparison, compare_runs, timed_generation, unet_flops
from sdperf.optimizations import half_precision
from sdperf.model.pipelines import build_pipeline


@pytest.fixture(scope="module")
def workload(smoke):
    return Workload.from_profile(smoke, batch_size=1, steps=3)


@pytest.fixture(scope="module")
def base_run(tiny_pipe, workload):
    return timed_generation(tiny_pipe, workload, device="cpu", warmup=1, repeats=2, label="fp32")


def test_stage_breakdown_accounts_for_every_stage(tiny_pipe, base_run, workload):
    st = base_run.stages.set_index("stage")
    assert list(st.index) == list(STAGES)
    # one UNet call per scheduler timestep (PLMS: steps + 1, its first timestep twice)
    assert st.loc["unet", "calls_per_generation"] == len(tiny_pipe.scheduler.timesteps) == workload.steps + 1
    assert st.loc["vae_decode", "calls_per_generation"] == 1
    assert st["share_percent"].sum() == pytest.approx(100.0)
    # the stages are inside the timed call, so they cannot add up to more than it
    assert st["seconds_per_image_call"].sum() <= base_run.timing.p90 * 1.05
    assert base_run.it_per_s == pytest.approx(base_run.iterations / base_run.loop_seconds)


def test_a_short_first_call_warms_every_stage_and_the_timed_calls_stay_whole(tiny_pipe, base_run, workload):
    calls = []
    hook = tiny_pipe.unet.register_forward_hook(lambda *_a: calls.append(1))
    try:
        run = timed_generation(tiny_pipe, workload, device="cpu", warmup=1, repeats=2, first_call_steps=1)
    finally:
        hook.remove()
    per_generation = workload.steps + 1  # PLMS runs its first timestep twice
    assert len(calls) == 1 + 2 * per_generation  # the 1-step first call (one UNet call), then two whole generations
    assert run.stages.set_index("stage").loc["unet", "calls_per_generation"] == per_generation
    assert torch.equal(run.output.latents, base_run.output.latents)  # the output is a whole generation's


def test_same_pipeline_compares_bit_identical(tiny_pipe, base_run, workload):
    again = timed_generation(tiny_pipe, workload, device="cpu", warmup=1, repeats=2, label="again")
    cmp = compare_runs(base_run, again)
    assert cmp["latent_rel_error"] == 0.0 and cmp["verdict"] == "bit-identical to the fp32 baseline"
    assert cmp["speedup_lo"] <= cmp["speedup"] <= cmp["speedup_hi"]


def test_compare_refuses_unlike_workloads(tiny_pipe, base_run, workload):
    other = timed_generation(tiny_pipe, Workload(**{**workload.__dict__, "batch_size": 2}), device="cpu",
                             warmup=1, repeats=1)
    with pytest.raises(ValueError, match="like with like"):
        compare_runs(base_run, other)


def test_unet_flops_scale_with_batch(tiny_pipe, smoke):
    one = unet_flops(tiny_pipe, Workload.from_profile(smoke, 1))
    two = unet_flops(tiny_pipe, Workload.from_profile(smoke, 2))
    assert one > 0 and two == 2 * one


def test_half_precision_availability_without_cuda():
    for dtype in ("float16", "bfloat16"):
        ok, reason = half_precision.availability("cpu", dtype)
        assert ok and reason
    ok, reason = half_precision.availability("cpu", "float32")
    assert not ok and "float16" in reason


def test_bf16_keeps_output_within_tolerance_and_reports_drift(smoke, base_run, workload):
    pipe = half_precision.apply(build_pipeline(smoke), "bfloat16")
    assert next(pipe.unet.parameters()).dtype == torch.bfloat16
    run = timed_generation(pipe, workload, device="cpu", warmup=1, repeats=1, label="bf16")
    cmp = compare_runs(base_run, run)
    assert 0 < cmp["latent_rel_error"] < 0.1  # lossy, but the same picture on the tiny network
    assert cmp["image_psnr_db"] > 30


def test_block_comparison_measures_one_real_block(tiny_pipe, workload):
    out = block_comparison(tiny_pipe, workload, torch.bfloat16, device="cpu", warmup=1, repeats=2)
    assert out["block"] == "down_blocks.0"
    assert len(out["variant_timing"].times) == 2 and out["speedup"] > 0
    assert 0 < out["block_rel_error"] < 0.1
    assert next(tiny_pipe.unet.parameters()).dtype == torch.float32  # the baseline pipeline is untouched
