"""Token merging for Stable Diffusion (tomesd; Bolya & Hoffman, arXiv 2303.17604).

Before each self-attention of the highest-resolution transformer blocks the most similar tokens are merged
(bipartite soft matching, one destination per 2x2 patch) and unmerged after; the gain scales with the token count.
tomesd's random choice of destinations draws from a generator seeded here from the profile's seed, so two runs of
one configuration merge alike.
"""
from __future__ import annotations

import importlib.util

import torch

from sdperf.optimizations.catalog import MERGING, Technique

NOTEBOOK = "03_attention"
TRANSFER = ("may not transfer",
            "token merging removes redundant tokens; the reference model has 64 tokens at its highest "
            "resolution, SD 1.5 at 512 px has 4096 (tomesd: FID -0.32 at ratio 0.3, -0.10 at 0.5)")
KEY_PREFIXES = ("tome",)
PACKAGES = ("tomesd",)  # what every key of the prefix imports
RATIOS = (0.3, 0.5)
MAX_RATIO = 0.75  # 1 - 1/(sx*sy) with tomesd's 2x2 stride: at most 3 of every 4 tokens can merge


def check_ratio(ratio) -> None:
    if not isinstance(ratio, float) or not 0.0 < ratio <= MAX_RATIO:
        raise ValueError(f"merge ratio must be a number in (0, {MAX_RATIO}], got {ratio!r}")


def availability(_ctx) -> tuple[bool, str]:
    if importlib.util.find_spec("tomesd") is None:
        return False, "the tomesd package is not installed (pip install tomesd, pinned in requirements.lock)"
    return True, "tomesd patches the PyTorch UNet's transformer blocks: runs wherever the UNet runs"


def merged_blocks(unet) -> int:
    """How many transformer blocks carry ToMe's patch (0: nothing would be merged)."""
    return sum(1 for m in unet.modules() if type(m).__name__ == "ToMeBlock")


def apply(pipe, ratio: float, seed: int = 0, ctx=None):
    """Patch the UNet's transformer blocks to merge `ratio` of the tokens before self-attention (else tomesd's
    defaults)."""
    import tomesd

    check_ratio(ratio)
    if not hasattr(pipe.unet, "down_blocks"):
        raise TypeError(f"token merging needs diffusers' UNet, but pipe.unet is {type(pipe.unet).__name__}: "
                        "it cannot follow an executor that replaces the UNet")
    tomesd.apply_patch(pipe, ratio=ratio)
    device = next(pipe.unet.parameters()).device
    pipe.unet._tome_info["args"]["generator"] = torch.Generator(device).manual_seed(seed)
    n = merged_blocks(pipe.unet)
    if n == 0:
        raise RuntimeError("tomesd patched no transformer block of this UNet (no BasicTransformerBlock found)")
    if ctx is not None:
        ctx.facts.update(tome_ratio=ratio, tome_blocks_patched=n)
    return pipe


def technique(prefix: str, arg: str) -> Technique:
    """tome:<ratio>: tomesd at that merge ratio."""
    try:
        ratio = float(arg)
    except ValueError:
        raise ValueError(f"give the merge ratio as a number in (0, {MAX_RATIO}], e.g. tome:0.5; got {arg!r}") from None
    check_ratio(ratio)
    return Technique(f"{prefix}:{ratio:g}", f"token merging {ratio:g}", MERGING, NOTEBOOK, transfer=TRANSFER, packages=PACKAGES,
                     apply=lambda pipe, ctx: apply(pipe, ratio, ctx.profile.seed, ctx), availability=availability,
                     changes_output=True, loop_only=True,
                     note=f"tomesd: {ratio:.0%} of the highest-resolution tokens merged before self-attention")


def techniques() -> list[Technique]:
    return [technique("tome", f"{r:g}") for r in RATIOS]
