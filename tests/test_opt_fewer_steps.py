"""Scheduler switches on the tiny pipeline: nothing else changes, same latents, fewer steps make fewer UNet calls."""
from __future__ import annotations

import itertools

import pytest
import torch

from sdperf.experiments import fewer_steps as fx
from sdperf.generation import Workload, generate, initial_latents
from sdperf.optimizations import fewer_steps as opt
from sdperf.pipelines import build_pipeline, build_random
from sdperf.results import read_results


@pytest.fixture
def pipe(smoke):
    return build_pipeline(smoke)


def _config(scheduler) -> dict:
    config = dict(scheduler.config)
    config.pop("_use_default_values", None)
    return config


def _unet_inputs(pipe, workload):
    seen = []
    handle = pipe.unet.register_forward_pre_hook(lambda m, a, kw: seen.append(a[0].clone()), with_kwargs=True)
    try:
        out = generate(pipe, workload)
    finally:
        handle.remove()
    return seen, out


def test_switch_changes_only_the_scheduler(pipe):
    networks = {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}
    before = {k: {n: t.clone() for n, t in m.state_dict().items()} for k, m in networks.items()}
    opt.apply(pipe, "dpmpp-2m")
    assert type(pipe.scheduler).__name__ == "DPMSolverMultistepScheduler"
    for name, module in networks.items():
        assert getattr(pipe, name) is module
        assert all(torch.equal(before[name][n], t) for n, t in module.state_dict().items())
    # whatever was switched before, the result equals a pipeline built with that scheduler from the start
    built = {name: _config(build_random("tiny", name).scheduler) for name in opt.SCHEDULERS}
    for first, second in itertools.permutations(opt.SCHEDULERS, 2):
        opt.apply(opt.apply(pipe, first), second)
        assert _config(pipe.scheduler) == built[second], (first, second)


def test_same_scheduler_and_steps_reproduce_the_reference_exactly(pipe, smoke):
    workload = Workload.from_profile(smoke, steps=3)
    reference = generate(pipe, workload)
    opt.apply(pipe, "euler")
    other = generate(pipe, workload)
    opt.apply(pipe, "plms")
    again = generate(pipe, workload)
    assert torch.equal(again.latents, reference.latents) and torch.equal(again.images, reference.images)
    assert not torch.equal(other.latents, reference.latents)  # the switch did take effect


def test_fewer_steps_make_fewer_unet_calls(pipe, smoke):
    counts = {}
    for scheduler, steps in (("plms", 8), ("plms", 4), ("dpmpp-2m", 3), ("euler", 3), ("ddim", 3)):
        opt.apply(pipe, scheduler)
        seen, _ = _unet_inputs(pipe, Workload.from_profile(smoke, steps=steps))
        counts[scheduler, steps] = len(seen)
        assert len(seen) == opt.unet_calls(pipe, steps)
    assert counts == {("plms", 8): 9, ("plms", 4): 5, ("dpmpp-2m", 3): 3, ("euler", 3): 3, ("ddim", 3): 3}


def test_every_scheduler_starts_from_the_same_latents(pipe, smoke):
    """Euler's latents are scaled by init_noise_sigma and its UNet input by 1/sqrt(sigma_0^2 + 1); the others
    start from the noise as it is. The loop applies both, so every scheduler's first UNet input is the noise."""
    workload = Workload.from_profile(smoke, steps=2)
    noise = torch.cat([initial_latents(pipe, workload)] * 2)
    for name in opt.SCHEDULERS:
        opt.apply(pipe, name)
        seen, _ = _unet_inputs(pipe, workload)
        sched = pipe.scheduler
        init = float(sched.init_noise_sigma)
        assert (init > 1.0) == (name == "euler")
        scale = init / (float(sched.sigmas[0]) ** 2 + 1) ** 0.5 if name == "euler" else 1.0
        torch.testing.assert_close(seen[0], noise * scale, rtol=1e-5, atol=1e-5)


def test_bad_scheduler_or_steps_name_the_choices(pipe):
    with pytest.raises(ValueError, match=r"scheduler 'lms' is not valid; choose one of: plms, ddim, euler, dpmpp-2m"):
        opt.apply(pipe, "lms")
    with pytest.raises(ValueError, match="'k-euler'.*dpmpp-2m"):
        opt.availability("cpu", "k-euler")
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        fx.parse([["plms", 0]])
    with pytest.raises(ValueError, match=r"\[scheduler, steps\]"):
        fx.parse(["plms"])
    assert opt.availability("cpu", "euler")[0]


def test_plan_cuts_repeats_to_the_budget_but_keeps_one(smoke, scratch_reports):
    from sdperf.study import open_study

    study = open_study("smoke", notebook="test_fewer_steps")
    pipe = study.pipeline()
    configs = [("plms", 4), ("dpmpp-2m", 2)]
    roomy = fx.plan(study, pipe, configs, budget_s=1e6)
    tight = fx.plan(study, pipe, configs, budget_s=1e-6)
    assert list(roomy["repeats"]) == [smoke.repeats] * 2 and list(tight["repeats"]) == [1, 1]
    assert list(roomy["unet_calls"]) == [5, 2]


def test_compare_schedulers_records_calls_speed_and_drift(smoke, scratch_reports):
    from sdperf.study import open_study

    study = open_study("smoke", notebook="test_fewer_steps")
    table, _, runs = fx.compare_schedulers(study, ("plms", 4), [("dpmpp-2m", 2), ("plms", 4)], budget_s=1e-6)
    assert list(table["variant"]) == ["plms 4 steps", "dpmpp-2m 2 steps"]  # the reference is not repeated
    assert list(table["unet_calls"]) == [5, 2] and list(table["repeats"]) == [1, 1]
    var = table.iloc[1]
    assert var["speedup"] > 0 and 0 < var["latent_rel_error"] < float("inf")
    assert "random weights" in var["verdict"]
    rows = read_results("smoke")
    calls = rows[(rows.notebook == "test_fewer_steps") & (rows.metric == "unet_calls")]
    assert sorted(calls["value"]) == [2, 5]
    assert not rows[(rows.notebook == "test_fewer_steps") & (rows.metric == "image_psnr_db")].empty
