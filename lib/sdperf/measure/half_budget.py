"""Whether a half precision's whole generations fit the profile's time budget: one rule, measured once per run.

Without native half-precision instructions fp16 generations can take hours: one UNet block timed against fp32 here
predicts them, and those over `variant_budget_s` are skipped. The first notebook of a run to ask keeps the answer.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sdperf.core import environment
from sdperf.core.paths import scratch_dir
from sdperf.measure.timing import Timing
from sdperf.measure.comparison import release
from sdperf.store.results import atomic_write_text, locked

# How the block comparison's own rows were taken (01 records them when a precision's generations are skipped)
BLOCK_TIMING_METHOD = ("one UNet block at the real shapes in one process, float32 and the half copy timed in turn; "
                       "median with p10/p90 of the repeats")
BLOCK_ERROR_METHOD = "||half - fp32|| / ||fp32|| of the block's output on the same captured inputs, in float64"


@dataclass(frozen=True)
class Probe:
    """One UNet block in `dtype` against float32 (speed-up = fp32 time / half time) and one fp32 generation."""

    dtype: str
    block: str
    speedup: float
    speedup_lo: float
    speedup_hi: float
    block_rel_error: float
    fp32_generation_s: float
    fp32_block_times: list[float]
    block_times: list[float]

    def timings(self) -> tuple[Timing, Timing]:
        """(fp32 block, half block) timings, for the rows that record the block comparison itself."""
        return Timing(self.fp32_block_times, first_call=float("nan")), Timing(self.block_times, first_call=float("nan"))

    def predicted_s(self, generations: int, fp32_generation_s: float | None = None) -> float:
        """Seconds `generations` whole generations in this precision would take, at the block's ratio."""
        return (fp32_generation_s or self.fp32_generation_s) / self.speedup * generations

    def skip_reason(self, generations: int, budget_s: float, what: str, fp32_generation_s: float | None = None):
        """Why `generations` of them cannot run within `budget_s` (None when they can)."""
        predicted = self.predicted_s(generations, fp32_generation_s)
        if predicted <= budget_s:
            return None
        return (f"one UNet block ({self.block}) in {self.dtype} takes {1 / self.speedup:.2f}x the float32 time "
                f"here [{1 / self.speedup_hi:.2f}-{1 / self.speedup_lo:.2f}x, measured in-process this run], so "
                f"{what} would take about {predicted:.0f} s, over variant_budget_s={budget_s:g} s")


def _path(study) -> Path:
    p = study.profile
    return scratch_dir(p.name) / "rounds" / f"{environment.run_id()}-{p.name}-half-budget.json"


def _key(study, dtype: str) -> str:
    return f"{dtype} {study.workload(1)!r}"


def probe(study, dtype: str) -> Probe:
    """The block comparison of `dtype` for this run: read back when an earlier notebook of the run measured it."""
    from sdperf.measure.measurements import block_comparison, timed_generation

    path, key = _path(study), _key(study, dtype)
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key in known:
        return Probe(**known[key])
    p = study.profile
    pipe = study.pipeline("float32")
    try:
        fp32_s = next((v["fp32_generation_s"] for v in known.values()), None)
        if fp32_s is None:
            # warmed by the profile's short first call, as every worker is
            fp32_s = timed_generation(pipe, study.workload(1), device=study.device, warmup=1, repeats=1,
                                      first_call_steps=p.first_call_steps).timing.median
        b = block_comparison(pipe, study.workload(1), getattr(torch, dtype), device=study.device,
                             warmup=p.warmup, repeats=p.repeats)
    finally:
        del pipe
        release()
    found = Probe(dtype, b["block"], float(b["speedup"]), float(b["speedup_lo"]), float(b["speedup_hi"]),
                  float(b["block_rel_error"]), float(fp32_s), list(b["baseline_timing"].times),
                  list(b["variant_timing"].times))
    with locked(path):  # another notebook's kernel may add its probe meanwhile: read, add and write as one
        known = json.loads(path.read_text()) if path.is_file() else {}
        known[key] = asdict(found)
        atomic_write_text(path, json.dumps(known))
    return found


def skips(study, keys, say=print) -> dict[str, str]:
    """{half-precision key among `keys`: why to skip it} where its rounds' generations would overrun the budget."""
    from sdperf.optimizations import catalog
    from sdperf.optimizations.catalog import Context

    p, out = study.profile, {}
    calls = p.rounds * (p.warmup + p.repeats)
    for key in sorted(k for k in keys if catalog.get(k).family == catalog.PRECISION
                      and catalog.get(k).availability(Context(p))[0]):
        found = probe(study, catalog.get(key).dtype)
        say(f"{key}: one UNet block takes {1 / found.speedup:.2f}x the float32 time; predicted "
            f"{found.predicted_s(calls):.0f} s for {calls} generations (budget {p.variant_budget_s} s)")
        why = found.skip_reason(calls, p.variant_budget_s, f"{calls} whole generations ({p.rounds} rounds)")
        if why:
            out[key] = why
    return out
