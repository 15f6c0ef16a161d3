"""Training-free cuts of classifier-free guidance: some steps run the conditional half alone, at half the batch.

- `guidance:cutoff@<share>`: no guidance after the first `share` of the steps, as diffusers' SDCFGCutoffCallback
  (`cutoff_step_ratio`): steps 0..int(n * share) are guided, the rest call the UNet on the prompt batch alone.
- `guidance:interval@<lo>-<hi>`: guidance only where the noise level sigma lies in (lo, hi] (Kynkäänniemi et al.
  2024, "Applying guidance in a limited interval"; their SD-XL interval is (0.28, 5.42]).

The loop reads the decision per step (sdperf.model.generation.GUIDED_AT); the worker times guided and unguided
calls apart (`call_kinds`) and composes an image from them, as it does for DeepCache's full and cached calls.
"""
from __future__ import annotations

import functools

import numpy as np

from sdperf.optimizations.catalog import GUIDANCE, Technique

NOTEBOOK = "09_fewer_steps"
KEY_PREFIXES = ("guidance",)
CANONICAL = ("cutoff@0.5", "interval@0.28-5.42")
TRANSFER = ("in kind, not in size",
            "how much a step's guidance matters depends on the model and the sampler: Kynkäänniemi et al. report "
            "FID 1.81 -> 1.40 (better) for EDM2-XXL on ImageNet-512 with the interval, diffusers no figure for its "
            "cutoff ('minimal'); compare the paired deltas, not the verdicts")
# SD's noise schedule (scaled_linear, 0.00085 to 0.012, 1000 steps): every profile's and the reference model's
SD_SCHEDULE = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012, "num_train_timesteps": 1000}
GUIDED, UNGUIDED = "guided", "unguided"


@functools.cache
def _sigmas() -> np.ndarray:
    betas = np.linspace(SD_SCHEDULE["beta_start"] ** 0.5, SD_SCHEDULE["beta_end"] ** 0.5,
                        SD_SCHEDULE["num_train_timesteps"], dtype=np.float64) ** 2
    alphas = np.cumprod(1 - betas)
    return np.sqrt((1 - alphas) / alphas)


def sigma(t: float) -> float:
    """The noise level of SD's schedule at timestep t (rounded to the training grid, as the UNet reads it)."""
    return float(_sigmas()[int(round(float(t)))])


def guided(rule: tuple, i: int, n: int, t: float) -> bool:
    """Whether step i of n, at timestep t, runs guidance under `rule` ('cutoff', share) or ('interval', lo, hi)."""
    if rule[0] == "cutoff":
        return i <= int(n * rule[1])
    return rule[1] < sigma(t) <= rule[2]


def call_kinds(rule: tuple, timesteps: list) -> list[str]:
    n = len(timesteps)
    return [GUIDED if guided(rule, i, n, t) else UNGUIDED for i, t in enumerate(timesteps)]


def availability(_ctx) -> tuple[bool, str]:
    return True, "the study's own loop skips the unconditional half on the cut steps: runs wherever the UNet runs"


def _check_schedule(pipe) -> None:
    config = dict(pipe.scheduler.config)
    odd = {k: config.get(k) for k, v in SD_SCHEDULE.items() if config.get(k) != v}
    if odd:
        raise ValueError(f"a guidance cut reads SD's noise schedule {SD_SCHEDULE}, but this pipeline's differs: {odd}")


def apply(pipe, rule: tuple, ctx=None):
    from sdperf.model.generation import GUIDED_AT

    _check_schedule(pipe)
    setattr(pipe, GUIDED_AT, lambda i, n, t: guided(rule, i, n, t))
    if ctx is not None:
        ctx.facts.update(guidance_cut=list(rule))
    return pipe


def parse(arg: str) -> tuple:
    """'cutoff@0.5' -> ('cutoff', 0.5); 'interval@0.28-5.42' -> ('interval', 0.28, 5.42); ValueError naming the forms."""
    name, _, value = arg.partition("@")
    try:
        if name == "cutoff":
            share = float(value)
            if 0 <= share < 1:
                return ("cutoff", share)
        elif name == "interval":
            lo, hi = (float(v) for v in value.split("-"))
            if 0 <= lo < hi:
                return ("interval", lo, hi)
    except ValueError:
        pass
    raise ValueError(f"give guidance:cutoff@<share> with share in [0, 1) (e.g. cutoff@0.5) or "
                     f"guidance:interval@<lo>-<hi> in sigma with 0 <= lo < hi (e.g. interval@0.28-5.42); got {arg!r}")


def technique(prefix: str, arg: str) -> Technique:
    rule = parse(arg)
    if rule[0] == "cutoff":
        key, label = f"{prefix}:cutoff@{rule[1]:g}", f"guidance cut after {rule[1]:.0%} of the steps"
        note = f"steps after the first {rule[1]:.0%} call the UNet on the prompt alone (SDCFGCutoffCallback)"
    else:
        key, label = f"{prefix}:interval@{rule[1]:g}-{rule[2]:g}", f"guidance in sigma ({rule[1]:g}, {rule[2]:g}]"
        note = "guidance only in a limited noise interval (Kynkäänniemi et al. 2024); other steps at half the batch"
    return Technique(key, label, GUIDANCE, NOTEBOOK, transfer=TRANSFER, apply=lambda pipe, ctx: apply(pipe, rule, ctx),
                     availability=availability, changes_output=True, loop_only=True,
                     call_kinds=lambda ts: call_kinds(rule, list(ts)), note=note)


def techniques() -> list[Technique]:
    return [technique("guidance", a) for a in CANONICAL]
