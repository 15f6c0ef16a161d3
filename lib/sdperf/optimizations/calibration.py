"""A technique of known cost, so the measuring method can be checked against a known answer.

`calibration:unet-twice` runs every UNet call twice: the output is unchanged and the UNet share costs exactly
double, so the per-step ratio against fp32 eager must come out at 0.5x; a method that reports otherwise is biased.
"""
from __future__ import annotations

import functools

from sdperf.optimizations.catalog import CALIBRATION, Technique


def unet_twice(pipe, _ctx=None):
    """Wrap the UNet's forward so every call runs twice (same inputs, the second result returned)."""
    unet = pipe.unet
    forward = unet.forward

    @functools.wraps(forward)
    def twice(*args, **kwargs):
        forward(*args, **kwargs)
        return forward(*args, **kwargs)

    unet.forward = twice
    return pipe


def techniques() -> list[Technique]:
    return [Technique("calibration:unet-twice", "UNet run twice per call (known 0.5x per step)", CALIBRATION,
                      "10_ladder", apply=unet_twice, loop_only=True, note="a check of the method, not an optimization")]
