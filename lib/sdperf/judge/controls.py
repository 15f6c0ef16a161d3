"""Controls that every quality run carries, so the budget itself is tested each time.

A budget that reads "within" for everything proves nothing; one that reads "over" for an identical twin is broken.
So each run judges the fp32 twin (the converged solve made again: "within") and known harms ("over"): a 4-step
solve, and Gaussian noise of the profile's doses on the UNet's output at every step (the same on both guidance
halves, so a share of the unit-variance noise the UNet predicts). Otherwise no stack is admitted (`trusted`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sdperf.judge.paired import OVER, WITHIN

PREFIX = "control:"
TWIN = "control:fp32-twin"
FEW_STEPS = 4


@dataclass(frozen=True)
class Control:
    key: str
    label: str
    expected: str  # the verdict the control must read
    steps: int | None = None  # its own step count (None: the converged solve's)
    noise: float = 0.0  # std of the Gaussian added to the UNet's output, per step


def expected(key: str) -> str:
    """What a control must read: the twin "within", every known harm "over"."""
    return WITHIN if key == TWIN else OVER


def noise_key(dose: float) -> str:
    return f"{PREFIX}unet-noise@{dose:g}"


def defaults(doses: tuple[float, ...]) -> tuple[Control, ...]:
    """The run's controls: the twin, the few-step solve and one noise control per dose."""
    from sdperf.model.pipelines import sampler_key
    from sdperf.judge.converged import SOLVER

    few = f"{PREFIX}{sampler_key(SOLVER, FEW_STEPS)}"
    return (Control(TWIN, "fp32 twin of the converged solve (negative control)", expected(TWIN)),
            Control(few, f"{SOLVER}, {FEW_STEPS} steps (positive control)", expected(few), steps=FEW_STEPS),
            *(Control(noise_key(d), f"Gaussian noise of std {d:g} on the UNet's output (positive control)",
                      expected(noise_key(d)), noise=d) for d in doses))


def is_control(key: str) -> bool:
    return isinstance(key, str) and key.startswith(PREFIX)


def add_output_noise(pipe, dose: float, seed: int = 0):
    """Adds seeded N(0, dose^2) to the UNet's output at every call, the same on both guidance halves; the hook."""
    if dose < 0:
        raise ValueError(f"noise dose {dose!r} is not valid; choose a std >= 0")
    g = torch.Generator("cpu").manual_seed(seed)

    def noisy(eps: torch.Tensor) -> torch.Tensor:
        half = eps.shape[0] // 2 or 1
        draw = torch.randn(eps[:half].shape, generator=g, dtype=torch.float32).to(eps.dtype)
        return eps + dose * torch.cat([draw] * (eps.shape[0] // half))

    def hook(_module, _args, output):
        if isinstance(output, torch.Tensor):
            return noisy(output)
        if isinstance(output, tuple):  # the loop calls the UNet with return_dict=False
            return (noisy(output[0]), *output[1:])
        return type(output)(sample=noisy(output.sample))

    return pipe.unet.register_forward_hook(hook)


def trusted(verdicts: dict[str, str], controls: tuple[Control, ...]) -> tuple[bool, list[str]]:
    """Whether every control read what it must; the failures named."""
    bad = [f"{c.key} read {verdicts.get(c.key, 'nothing')!r}, must read {c.expected!r}" for c in controls
           if verdicts.get(c.key) != c.expected]
    return not bad, bad
