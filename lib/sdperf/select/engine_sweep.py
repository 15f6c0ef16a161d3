"""Which engine 07's NeMo-shaped batch sweep times, and which of its batch sizes fit the sweep's budget.

07 decides both from its batch-1 comparison of engines. `sdperf run` (sdperf.run.prefetch) decides the same from the
same rounds so that it can measure the sweep's larger batches before the notebooks, where 00 then finds the fp32
processes it describes at those batch sizes too (one set of baselines for both, not one each). The rule has one
home so that the two always choose alike; 07 run alone decides and measures by itself, as before.
"""
from __future__ import annotations

from sdperf.measure.comparison import BASELINE, Comparison

LOSSLESS_REL_ERROR = 1e-3  # an engine whose latents move more than this is not a drop-in for the sweep


def best_engine(cmp: Comparison, keys: list[str] | None = None) -> str | None:
    """The key of the engine (among `keys`, when given) with the fastest UNet step among those that keep the
    latents (relative error <= LOSSLESS_REL_ERROR); None when no engine qualifies."""
    ok = cmp.ok()
    ok = ok[ok.key.astype(str).str.startswith("engine:") & (ok.latent_rel_error <= LOSSLESS_REL_ERROR)]
    if keys is not None:
        ok = ok[ok.key.isin(keys)]
    if ok.empty:
        return None
    return ok.loc[ok.unet_step_speedup.idxmax(), "key"]


def estimate_s(profile, cmp: Comparison, key: str, b: int) -> float:
    """Seconds the comparison of `key` at batch `b` should take, scaled from batch 1: every process builds, sets
    up, makes its first call and its repeats; generation time grows with the batch."""
    rounds = cmp.measured.rounds
    base, eng = cmp.row(BASELINE), cmp.ok().set_index("key").loc[key]
    gens = 1 + max(profile.warmup - 1, 0) + profile.repeats

    def one(r):
        return r["build_s"] + r["setup_s"] + b * gens * r["latency_s"]
    return (rounds + 1) * one(base) + rounds * (one(base) + one(eng))  # baselines, the twin, the engine


def within_budget(profile, cmp: Comparison, key: str, batch_sizes: list[int], budget_s: float) -> list[int]:
    """The sweep's batch sizes beyond 1 whose comparison is estimated to fit `budget_s` (07 records the others as
    skipped rows with their estimate)."""
    return [int(b) for b in batch_sizes if int(b) != 1 and estimate_s(profile, cmp, key, int(b)) <= budget_s]
