"""09's section on what CPU users deploy: step-distilled students, guidance in one call, a tiny decoder, guidance
cuts, alone and stacked, each in fresh processes in rounds against fp32 eager PLMS-50 on the profile's architecture.

A worker composes its image from its own measured stages at its own call count: a student at its steps and batch 1,
a guidance cut from its guided and unguided calls timed apart, the tiny decoder's decode timed in place of the VAE's.
The picture they make is judged on the reference model by 12 (their students are trained there); here, on random
weights, only the speed is the real architecture's.
"""
from __future__ import annotations

import pandas as pd

from sdperf.experiments.common import ratio_columns
from sdperf.measure.comparison import BASELINE, TWIN, run_variants
from sdperf.measure.study import Study
from sdperf.optimizations import catalog

FAMILIES = (catalog.DISTILLED, catalog.DECODER, catalog.GUIDANCE)
COLUMNS = ["variant", "status", *ratio_columns("seed_speedup"), "s_per_image_seed", "unet_calls", "unet_step_s",
           "vae_decode_s", "note"]


def check(keys: list[str]) -> list[str]:
    """Each key a stack holding a deployed technique (FAMILIES), else ValueError naming the valid keys."""
    for k in keys:
        if not any(t.family in FAMILIES for t in catalog.Stack.of(k).techniques):
            valid = [key for f in FAMILIES for key in catalog.keys(family=f)]
            raise ValueError(f"{k!r} holds no student, tiny decoder or guidance cut; valid: {', '.join(valid)} "
                             "(distill:lcm@<steps>, guidance:cutoff@<share>, guidance:interval@<lo>-<hi>)")
    return list(keys)


def timing(study: Study, keys: list[str]) -> pd.DataFrame:
    """Per image at each configuration's own steps against fp32 eager PLMS-50, with its UNet calls and decode."""
    cmp = run_variants(study, check(keys), batch_size=1)
    summary = cmp.measured.summary.set_index("config")
    t = cmp.table[~cmp.table.variant.isin([BASELINE, TWIN])].copy()
    for col, src in (("s_per_image_seed", "s_per_image_seed"), ("unet_calls", "seed_unet_calls"),
                     ("unet_step_s", "unet_step_s"), ("vae_decode_s", "vae_decode_s")):
        t[col] = t.variant.map(summary[src]) if src in summary else None
    return t.reindex(columns=COLUMNS).reset_index(drop=True)


def findings(t: pd.DataFrame) -> list[str]:
    """One sentence per timed configuration: its speed with range and verdict; its quality is 12's."""
    out = []
    for r in t[t.status == "ok"].itertuples():
        out.append(f"{r.variant}: {r.seed_speedup:.1f}x per image over fp32 eager PLMS-50 ({r.seed_speedup_lo:.1f}-"
                   f"{r.seed_speedup_hi:.1f}x over rounds, {r.seed_speedup_verdict}), {r.unet_calls:.0f} UNet calls; "
                   "quality: judged on the reference model in 12")
    return out
