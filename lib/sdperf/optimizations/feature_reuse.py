"""DeepCache: reuse the UNet's deep features between denoising steps (Ma et al., arXiv 2312.00858).

A trained UNet's deep features change slowly between steps: DeepCache runs the whole UNet every `interval` calls
and in between only the shallow branch, reading the cached deep features. `DeepCacheSDHelper` wraps the blocks of a
diffusers UNet2DConditionModel, so it cannot stack on an executor that replaces the UNet. On random weights the
drift says nothing about the method: its quality is judged on the trained reference model.
"""
from __future__ import annotations

import importlib.util

from sdperf.optimizations.catalog import CACHING, Technique

NOTEBOOK = "09_fewer_steps"
TRANSFER = ("may not transfer",
            "DeepCache reuses deep features between steps; how much they change per step depends on the UNet's "
            "depth and the step count (the paper: SD 1.5 at 50 PLMS steps, 2.3x for a 0.05 CLIP-score drop)")
KEY_PREFIXES = ("deepcache",)
PACKAGES = ("DeepCache",)  # what every key of the prefix imports
INTERVALS = (2, 3, 5)
BRANCH = 0  # the shallowest branch: the most reuse, the paper's setting for its SD 1.5 speed-ups


def check_interval(interval) -> None:
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 2:
        raise ValueError(f"cache interval must be an integer >= 2 (1 would recompute every step), got {interval!r}")


def availability(_ctx) -> tuple[bool, str]:
    if importlib.util.find_spec("DeepCache") is None:
        return False, "the DeepCache package is not installed (pip install DeepCache, pinned in requirements.lock)"
    return True, "DeepCache's SD helper on the PyTorch UNet's blocks: runs wherever the UNet runs"


def apply(pipe, interval: int, ctx=None):
    """Wrap the pipeline's UNet blocks so that only every `interval`-th UNet call runs the deep branch."""
    from diffusers import UNet2DConditionModel
    from DeepCache import DeepCacheSDHelper

    check_interval(interval)
    if not isinstance(pipe.unet, UNet2DConditionModel):
        raise TypeError(f"DeepCache needs diffusers' UNet2DConditionModel, but pipe.unet is "
                        f"{type(pipe.unet).__name__}: it cannot follow an executor that replaces the UNet")
    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=interval, cache_branch_id=BRANCH)
    helper.enable()
    pipe._sdperf_deepcache = helper  # kept alive with the pipeline (disable() restores the blocks)
    if ctx is not None:
        ctx.facts.update(deepcache_interval=interval, deepcache_branch=BRANCH)
    return pipe


def call_kinds(timesteps: list, interval: int) -> list[str]:
    """Which UNet calls run whole ("full") and which reuse the cache ("cached"), as DeepCacheSDHelper decides: every
    `interval`-th timestep index from the first call's is full (PLMS's repeated timestep shares one index)."""
    index = [timesteps.index(t) for t in timesteps]
    return ["full" if (i - index[0]) % interval == 0 else "cached" for i in index]


def technique(prefix: str, arg: str) -> Technique:
    """deepcache:<interval>: the deep features recomputed every `interval` UNet calls, reused in between."""
    if not arg.isdigit():
        raise ValueError(f"give the cache interval as an integer >= 2, e.g. deepcache:3; got {arg!r}")
    n = int(arg)
    check_interval(n)
    return Technique(f"{prefix}:{n}", f"DeepCache, interval {n}", CACHING, NOTEBOOK, transfer=TRANSFER, packages=PACKAGES,
                     apply=lambda pipe, ctx: apply(pipe, n, ctx), availability=availability,
                     changes_output=True, loop_only=True, call_kinds=lambda ts: call_kinds(list(ts), n),
                     note=f"full UNet every {n} calls, shallow branch {BRANCH} with cached deep features between")


def techniques() -> list[Technique]:
    return [technique("deepcache", str(n)) for n in INTERVALS]
