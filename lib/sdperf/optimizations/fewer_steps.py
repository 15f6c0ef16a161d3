"""The scheduler as an optimization: fewer UNet calls for (roughly) the same end point.

Every step costs one UNet call and the scheduler's arithmetic is tiny next to it, so the saving is the number of
calls; what changes is where the trajectory ends, the drift this step reports. Swapping the scheduler touches
nothing else. The new one is built from the model's configuration, without the values the old one held only as
class defaults or sdperf's settings for its class, so it equals a pipeline built with it from the start.
"""
from __future__ import annotations

from sdperf.model.pipelines import SCHEDULER_CLASSES, SPACINGS, make_scheduler, parse_sampler, sampler_spec, spacings
from sdperf.optimizations.catalog import SCHEDULER, Technique

SCHEDULERS = tuple(SCHEDULER_CLASSES)


def check_scheduler(spec: str) -> None:
    """A sampler '<scheduler>[:<spacing>]' (sdperf.model.pipelines.parse_sampler), or ValueError naming the choices."""
    parse_sampler(spec)


def check_steps(steps) -> None:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")


def availability(device: str, scheduler: str) -> tuple[bool, str]:
    """Every scheduler is host-side arithmetic on the latents, so it runs wherever the UNet runs."""
    cls_name, _ = SCHEDULER_CLASSES[parse_sampler(scheduler)[0]]
    return True, f"diffusers {cls_name}: scheduler arithmetic only, runs on {device} beside the UNet"


def scheduler_config(pipe) -> dict:
    """The model's noise-schedule configuration: the one the current scheduler was made from (make_scheduler keeps
    it), else its config without its class defaults and sdperf's settings for its class."""
    kept = getattr(pipe.scheduler, "sdperf_model_config", None)
    if kept is not None:
        return dict(kept)
    config = dict(pipe.scheduler.config)
    drop = set(config.pop("_use_default_values", None) or ())
    cls_name = type(pipe.scheduler).__name__
    drop |= {k for name, extra in SCHEDULER_CLASSES.values() if name == cls_name for k in extra}
    return {k: v for k, v in config.items() if k not in drop and not k.startswith("_")}


def apply(pipe, scheduler: str):
    """Replace the pipeline's scheduler in place (nothing else changes) and return the pipeline."""
    check_scheduler(scheduler)
    pipe.scheduler = make_scheduler(scheduler, scheduler_config(pipe))
    return pipe


def unet_calls(pipe, steps: int) -> int:
    """UNet calls one generation makes with the current scheduler at `steps` (PLMS: steps + 1)."""
    check_steps(steps)
    sched = pipe.scheduler
    sched.set_timesteps(steps, device="cpu")
    return len(sched.timesteps)


NOTEBOOK = "09_fewer_steps"
TRANSFER = ("in kind, not in size",
            "a sampler's error is a property of the ODE solver and the guidance, which both models share; its "
            "size depends on the model's score function: SD 1.4 at guidance 7.5 has latent MSE 0.46 at 10 "
            "DPM-Solver++ steps (DPM-Solver-v3), so compare the latent MSE columns, not the verdicts")
KEY_PREFIXES = ("scheduler",)
CANONICAL = (("dpmpp-2m", 20), ("dpmpp-2m", 25), ("euler", 20), ("euler", 25), ("ddim", 25), ("plms", 25))


def technique(prefix: str, arg: str) -> Technique:
    """scheduler:<name>@<steps>[:<spacing>]: the pipeline's scheduler replaced and run at that step count, at the
    model's configured spacing or the one given (sdperf.model.pipelines.SPACINGS)."""
    name, sep, rest = arg.partition("@")
    steps, has_spacing, spacing = rest.partition(":")
    check_scheduler(name)
    if not sep or not steps.isdigit() or int(steps) < 1:
        raise ValueError(f"give the step count as <scheduler>@<steps>[:<spacing>] with steps >= 1, e.g. dpmpp-2m@20 "
                         f"or euler@6:trailing; got {arg!r}")
    if has_spacing and spacing not in spacings(name):
        raise ValueError(f"spacing {spacing!r} of {prefix}:{arg} is not valid; choose one of: "
                         f"{', '.join(spacings(name))}, or none for the model's configured spacing")
    n, spec = int(steps), sampler_spec(name, spacing if has_spacing else None)
    tail, words = (f":{spacing}", f", {'Karras sigmas' if spacing == 'karras' else spacing + ' spacing'}") \
        if has_spacing else ("", "")
    return Technique(f"{prefix}:{name}@{n}{tail}", f"{name}, {n} steps{words}", SCHEDULER, NOTEBOOK, transfer=TRANSFER,
                     apply=lambda pipe, ctx: apply(pipe, spec),
                     availability=lambda ctx: availability(ctx.device, spec), changes_output=True, steps=n,
                     sampler=spec, loop_only=True,
                     note="fewer UNet calls; the image moves with the sampler, its step count and its spacing")


def techniques() -> list[Technique]:
    return [technique("scheduler", f"{name}@{n}") for name, n in CANONICAL]
