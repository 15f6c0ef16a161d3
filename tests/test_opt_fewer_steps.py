"""Scheduler switches on the tiny pipeline: nothing else changes, same latents, fewer steps make fewer UNet calls."""
from __future__ import annotations

import itertools

import pandas as pd
import pytest
import torch

from sdperf.measure.comparison import run_variants
from sdperf.core.errors import ConfigError
from sdperf.experiments import fewer_steps as fx
from sdperf.model.generation import Workload, generate, initial_latents
from sdperf.optimizations import fewer_steps as opt
from sdperf.model.pipelines import build_pipeline, build_random
from sdperf.store.results import read_results


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
    specs = opt.SCHEDULERS + ("euler:trailing", "dpmpp-2m:karras", "ddim:linspace")  # a spacing does not stick
    built = {name: _config(build_random("tiny", name).scheduler) for name in specs}
    for first, second in itertools.permutations(specs, 2):
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
    with pytest.raises(ConfigError, match="steps >= 1"):
        fx.parse("scheduler:plms@0")
    with pytest.raises(ValueError, match="not a scheduler technique"):
        fx.check(["scheduler:plms@4", "precision:float16"])
    assert fx.parse("scheduler:dpmpp-2m@20") == ("dpmpp-2m", 20)
    assert opt.availability("cpu", "euler")[0]


def test_compare_times_each_scheduler_against_plms_50_composed(smoke, scratch_reports):
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="test_fewer_steps")
    cmp = run_variants(study, ["scheduler:dpmpp-2m@2"], rounds_=1, overrides={"warmup": 1, "repeats": 1},
                          say=lambda _: None)
    timing = fx.timing_table(cmp)
    assert list(timing["variant"]) == ["fp32 eager", "scheduler:dpmpp-2m@2"]  # the twin is the noise floor only
    assert list(timing["unet_calls"]) == [51, 2]  # PLMS at the seeds' 50 steps vs the scheduler's own
    row = timing.iloc[1]
    # 2 UNet calls against 51: composed per image, the scheduler is many times faster whatever the noise
    assert row["seed_speedup"] > 5 and row["seed_speedup_verdict"] in ("faster", "within noise")
    rows = read_results("smoke")
    mine = rows[(rows.notebook == "test_fewer_steps") & (rows.metric == "seed_speedup_vs_fp32")]
    assert set(mine["key"]) >= {"scheduler:dpmpp-2m@2"} and mine["method"].str.contains("fresh process").all()


def test_drift_is_measured_from_the_reference_generation(smoke, scratch_reports):
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="test_fewer_steps")
    d = fx.drift_from_reference(study, "scheduler:plms@4", ["scheduler:plms@4", "scheduler:dpmpp-2m@2"])
    same, other = d.iloc[0], d.iloc[1]
    assert same["latent_rel_error"] == 0 and list(d["unet_calls"]) == [5, 2]
    assert 0 < other["latent_rel_error"] < float("inf") and "random weights" in other["verdict"]
    rows = read_results("smoke")
    assert not rows[(rows.notebook == "test_fewer_steps") & (rows.metric == "image_psnr_db")].empty


def test_a_profile_without_scheduler_drift_generates_nothing_and_says_why(smoke, scratch_reports, monkeypatch,
                                                                          capsys):
    import dataclasses

    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="test_fewer_steps")
    study.profile = dataclasses.replace(study.profile, scheduler_drift=False)
    monkeypatch.setattr(fx, "generate", lambda *a, **k: pytest.fail("no drift generation may run"))
    d = fx.drift_from_reference(study, "scheduler:plms@4", ["scheduler:dpmpp-2m@2"])
    assert d.empty and list(d.columns) == fx.DRIFT_COLUMNS
    assert "scheduler_drift false" in capsys.readouterr().out
    fx.plot(study, pd.DataFrame({"variant": ["fp32 eager"], "status": ["ok"], "unet_calls": [51],
                                 "s_per_image_seed": [1.0]}), d)  # the figure still draws, saying why


def test_a_spacing_is_a_technique_of_its_own_and_starts_the_solve_at_the_last_training_timestep(pipe, smoke):
    """scheduler:<name>@<steps>[:<spacing>]: without a spacing the model's configured one (the SD config's leading,
    first step below t=999), with :trailing or :karras the first step at t=999; the next switch forgets it."""
    from sdperf.optimizations import catalog
    from sdperf.select import stack_search

    plain, spaced = catalog.get("scheduler:euler@6"), catalog.get("scheduler:euler@6:trailing")
    assert (spaced.key, spaced.label, spaced.steps, spaced.sampler) == \
        ("scheduler:euler@6:trailing", "euler, 6 steps, trailing spacing", 6, "euler:trailing")
    assert plain.sampler == "euler" and fx.parse(spaced.key) == ("euler:trailing", 6)
    last = pipe.scheduler.config.num_train_timesteps - 1
    for tech, first in ((spaced, last), (plain, 831), (catalog.get("scheduler:dpmpp-2m@6:karras"), last)):
        tech.apply(pipe, None)
        pipe.scheduler.set_timesteps(tech.steps)
        assert int(pipe.scheduler.timesteps[0]) == first, tech.key
        assert stack_search.timesteps(smoke, tech.key)[0] == first  # 10's search prices the same calls
    assert pipe.scheduler.config.use_karras_sigmas
    workload = Workload.from_profile(smoke, steps=4)
    catalog.get("scheduler:euler@4").apply(pipe, None)
    leading = generate(pipe, workload)
    catalog.get("scheduler:euler@4:trailing").apply(pipe, None)
    assert not torch.equal(generate(pipe, workload).latents, leading.latents)  # the spacing moves the picture


@pytest.mark.parametrize("key, says", [("scheduler:euler@6:middle", "leading, trailing, linspace, karras"),
                                       ("scheduler:plms@6:karras", "choose one of: leading, trailing, linspace, or none"),
                                       ("scheduler:euler@:trailing", "steps >= 1")])
def test_a_bad_spacing_names_the_valid_ones(key, says):
    from sdperf.optimizations import catalog

    with pytest.raises(ConfigError) as err:
        catalog.get(key)
    assert says in str(err.value) and key.split(":", 1)[1].split("@")[0] in str(err.value)
