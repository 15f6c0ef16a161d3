"""Which engine 07's NeMo-shaped batch sweep times, and which of its batch sizes fit the sweep's budget: one rule,
for 07 and for sdperf.run.prefetch deciding the same from the same rounds, so the two always choose alike."""
from __future__ import annotations

from sdperf.measure.comparison import BASELINE, Comparison

LOSSLESS_REL_ERROR = 1e-3  # an engine whose latents move more than this is not a drop-in for the sweep


def best_engine(cmp: Comparison, keys: list[str] | None = None) -> str | None:
    """The engine (among `keys`) with the fastest UNet step that keeps the latents (<= LOSSLESS_REL_ERROR), or None."""
    ok = cmp.ok()
    ok = ok[ok.key.astype(str).str.startswith("engine:") & (ok.latent_rel_error <= LOSSLESS_REL_ERROR)]
    if keys is not None:
        ok = ok[ok.key.isin(keys)]
    if ok.empty:
        return None
    return ok.loc[ok.unet_step_speedup.idxmax(), "key"]


def estimate_s(profile, cmp: Comparison, key: str, b: int) -> float:
    """Seconds the comparison of `key` at batch `b` should take, its generation time scaled from batch 1."""
    rounds = cmp.measured.rounds
    base, eng = cmp.row(BASELINE), cmp.ok().set_index("key").loc[key]
    gens = 1 + max(profile.warmup - 1, 0) + profile.repeats

    def one(r):
        return r["build_s"] + r["setup_s"] + b * gens * r["latency_s"]
    return (rounds + 1) * one(base) + rounds * (one(base) + one(eng))  # baselines, the twin, the engine


def within_budget(profile, cmp: Comparison, key: str, batch_sizes: list[int], budget_s: float) -> list[int]:
    return [int(b) for b in batch_sizes if int(b) != 1 and estimate_s(profile, cmp, key, int(b)) <= budget_s]
