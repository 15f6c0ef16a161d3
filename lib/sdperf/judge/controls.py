"""Controls that every quality run carries, so the budget itself is tested each time.

A budget that reads "within" for everything proves nothing; one that reads "over" for an identical twin is broken.
So each run judges, beside the techniques and by the same code:
- a negative control, the fp32 twin: the converged solve made again by a fresh pipeline (every interval must
  contain 0 and the verdict must be "within");
- positive controls of known harm, which must read "over": a 4-step solve of the same sampler, and Gaussian noise
  added to the UNet's output at every step at the profile's doses (cpu: two, one of them near the budget line;
  smoke: the gross harm alone), the same noise on the conditional and unconditional halves, so the dose is a share
  of the unit-variance noise the UNet predicts, not amplified by guidance.
If any control reads otherwise, the run says the budget cannot be trusted and no stack is admitted (`trusted`).
Controls are not techniques of the catalog (nothing here makes anything faster): they live here, found by key.
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
    """Adds N(0, dose^2) to the UNet's output at every call, seeded, the same draw on both guidance halves (the
    loop stacks [uncond, cond]); returns the hook's handle (remove() undoes it)."""
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
