"""The best stack under the quality budget: every compatible combination, not a greedy walk one rung at a time.

A greedy ladder keeps a rung only if it is fast and harmless alone, so it never tries int8 with fewer steps when int8
alone was "undecided". A candidate (one UNet configuration, one scheduler at a step count, optionally a stage engine)
has its speed composed per round from that round's measured parts (`composed_s`), since measuring every combination
would take hours; the chosen stacks are then measured whole, and only those measurements make the headline. It is
admissible only when EVERY lossy part alone (its sampler included) and the stack rendered whole are "within budget"
against the converged fp32 solve on the reference model, so no part's "gain" can pay for another's loss (`search`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from sdperf.optimizations import catalog
from sdperf.optimizations.catalog import BASELINE_KEY, Stack
from sdperf.measure.rounds import BASELINE, noise_band, speed_verdict

UNET_FAMILIES = (catalog.PRECISION, catalog.EXECUTOR, catalog.CACHING, catalog.MERGING, catalog.ATTENTION,
                 catalog.GRAD_MODE, catalog.DISTILLED, catalog.GUIDANCE)
STAGE_FAMILIES = (catalog.STAGES, catalog.DECODER)  # what a candidate's stage part may be: an engine or a tiny decoder
ADMISSIBLE, INADMISSIBLE, PRUNED, NOT_JUDGED = "admissible", "not admissible", "not rendered", "not judged"
LOSSLESS_QUALITY = "lossless by declaration: no technique may change the picture"
COMPOSED = ("composed per round from the measured parts (text encoder + UNet calls at the scheduler's count, each at "
            "its kind's median + scheduler steps + VAE decode) over the fp32 baseline at 50 PLMS steps interpolated "
            "to the part's worker")


@dataclass(frozen=True)
class Candidate:
    """One combination of stack keys: UNet, scheduler and stage engine ('' = fp32 eager, PLMS-50, PyTorch's)."""

    unet: str = ""
    scheduler: str = ""
    stages: str = ""

    @property
    def key(self) -> str:
        return catalog.join([k for k in (self.unet, self.stages, self.scheduler) if k])

    @property
    def parts(self) -> list[str]:
        return [k for part in (self.unet, self.stages, self.scheduler) if part for k in catalog.split(part)]

    @property
    def lossless(self) -> bool:
        return not Stack.of(self.parts).changes_output

    @property
    def owner(self) -> str:
        """The part that brings its own sampler and steps (a consistency student), '' when none does."""
        return next((k for k in self.parts if catalog.get(k).owns_sampler), "")

    @property
    def sampler(self) -> str:
        """Its sampler as a key: its scheduler, the part that owns its sampler, or fp32 PLMS at the seeds' steps
        (what the loop runs without one)."""
        from sdperf.judge.techniques import SEEDS_SAMPLER

        return self.scheduler or self.owner or SEEDS_SAMPLER

    @property
    def lossy_parts(self) -> list[str]:
        """Every part that may change the picture, the sampler included: each must be within budget alone."""
        own = [k for k in self.parts if catalog.get(k).changes_output and catalog.get(k).family != catalog.SCHEDULER]
        return own + ([] if self.owner else [self.sampler])

    @property
    def picture_key(self) -> str:
        """Its lossy parts as one stack: what its quality is judged by, so candidates share renderings."""
        return catalog.join(self.lossy_parts)


def unet_side(key: str) -> bool:
    """A stack that changes only how the UNet runs (what one worker's UNet calls measure)."""
    return all(t.family in UNET_FAMILIES for t in Stack.of(key).techniques)


def candidates(unets: list[str], schedulers: list[str], stages: list[str]) -> list[Candidate]:
    """Every combination of one UNet configuration, scheduler and stage engine (each optional) that can stack."""
    out = []
    for u, s, g in itertools.product([""] + list(unets), [""] + list(schedulers), [""] + list(stages)):
        try:
            Stack.of([k for part in (u, g, s) if part for k in catalog.split(part)])
        except Exception:  # two of one family: not a stack
            continue
        out.append(Candidate(u, s, g))
    return out


def _stage(row, name: str, column: str) -> float:
    for s in row["stages"] or ():
        if s["stage"] == name:
            return float(s[column])
    return 0.0


def call_counts(kinds_of: Callable[[int], list[str]] | None, timesteps: list) -> dict[str, int]:
    kinds = kinds_of(timesteps) if kinds_of is not None else ["any"] * len(timesteps)
    return {k: kinds.count(k) for k in set(kinds)}


def composed_s(unet_row, stage_row, timesteps: list, kinds_of) -> float:
    """One image: text encoder and decode from the stage worker (else the UNet's), UNet calls, scheduler steps."""
    around = stage_row if stage_row is not None else unet_row
    counts = call_counts(kinds_of, timesteps)
    per_kind = unet_row.get("unet_kind_s") if kinds_of is not None else None
    unet = sum(n * (per_kind[k] if per_kind else _stage(unet_row, "unet", "median_call_s")) for k, n in counts.items())
    return (_stage(around, "text_encoder", "seconds_per_image_call") + unet
            + len(timesteps) * _stage(unet_row, "scheduler", "median_call_s") + float(around["vae_decode_s"]))


def _rows(raw: pd.DataFrame, config: str) -> pd.DataFrame:
    return raw[(raw.config == config) & (raw.status == "ok")].sort_values("round")


def composed_speed(raw: pd.DataFrame, ratios: pd.DataFrame, names: dict[str, str], cand: Candidate,
                   timesteps: list) -> dict:
    """Per round, fp32 PLMS-50 over the composed candidate (`names`: key -> config in `raw`); median, min-max."""
    unet_name = names.get(cand.unet or BASELINE_KEY)
    if unet_name is None or (cand.stages and cand.stages not in names):
        return {"status": "not measured"}
    urows = _rows(raw, unet_name)
    grows = _rows(raw, names[cand.stages]) if cand.stages else None
    kinds_of = Stack.of(cand.unet).call_kinds if cand.unet else None
    # fp32 PLMS-50 interpolated to the worker (rounds.per_round_ratios), or for an fp32-eager UNet the worker itself
    base = None if unet_name == BASELINE else \
        ratios[ratios.config == unet_name].set_index("round")["baseline_s_per_image_seed"]
    values, secs = [], []
    for _, u in urows.iterrows():
        if base is not None and u["round"] not in base.index:
            continue
        g = None
        if grows is not None:
            same = grows[grows["round"] == u["round"]]
            if same.empty:
                continue
            g = same.iloc[0]
        s = composed_s(u, g, timesteps, kinds_of)
        values.append(float(u["s_per_image_seed"] if base is None else base.loc[u["round"]]) / s)
        secs.append(s)
    if not values:
        return {"status": "not measured"}
    return {"status": "ok", "s_per_image": float(np.median(secs)), "speedup": float(np.median(values)),
            "speedup_lo": float(min(values)), "speedup_hi": float(max(values)), "rounds": len(values),
            "unet_calls": len(timesteps)}


def failing_part(cand: Candidate, part_verdicts: dict[str, str]) -> tuple[str, str] | None:
    """The first lossy part not within budget alone, with its verdict ("not judged" when unknown), or None."""
    from sdperf.judge.techniques import WITHIN

    for part in cand.lossy_parts:
        verdict = part_verdicts.get(part)
        if verdict != WITHIN:
            return part, verdict if isinstance(verdict, str) else "not judged"
    return None


def search(table: pd.DataFrame, band: tuple[float, float], judge: Callable[[list[str]], pd.DataFrame],
           part_verdicts: dict[str, str], *, max_quality: int, batch: int = 4, trusted: bool = True,
           distrust: str = "") -> pd.DataFrame:
    """Judge `table`'s candidates fastest first, rendering with `judge(keys)`, until one is admissible or `max_quality`
    renderings are spent; `part_verdicts`: each lossy part's verdict alone; untrusted controls admit no lossy one."""
    from sdperf.judge.techniques import WITHIN

    t = table.sort_values("speedup", ascending=False).reset_index(drop=True).copy()
    t["speed_verdict"] = [speed_verdict(lo, hi, band) for lo, hi in zip(t.speedup_lo, t.speedup_hi)]
    t["admissible"], t["why"] = NOT_JUDGED, ""
    rendered = 0
    quality: dict[str, dict] = {}
    for i in range(len(t)):
        cand = t.at[i, "candidate"]
        if t.at[i, "speed_verdict"] != "faster":
            t.at[i, "admissible"], t.at[i, "why"] = INADMISSIBLE, f"speed {t.at[i, 'speed_verdict']}"
            continue
        if cand.lossless:
            t.at[i, "admissible"], t.at[i, "why"] = ADMISSIBLE, LOSSLESS_QUALITY
            break
        if not trusted:
            t.at[i, "admissible"], t.at[i, "why"] = INADMISSIBLE, f"the budget cannot be trusted: {distrust}"
            continue
        bad = failing_part(cand, part_verdicts)
        if bad:
            t.at[i, "admissible"], t.at[i, "why"] = PRUNED, f"{bad[0]} alone is {bad[1]}, not within the budget"
            continue
        if cand.picture_key not in quality:
            if rendered >= max_quality and cand.picture_key not in part_verdicts:
                t.at[i, "why"] = f"search stopped: {max_quality} stacks rendered on the reference model"
                break
            todo = [cand.picture_key]
            for j in range(i + 1, len(t)):
                other = t.at[j, "candidate"]
                if (len(todo) < batch and t.at[j, "speed_verdict"] == "faster" and not other.lossless
                        and not failing_part(other, part_verdicts)
                        and other.picture_key not in quality and other.picture_key not in todo):
                    todo.append(other.picture_key)
            todo = todo[:max(1, min(len(todo), max_quality - rendered))]
            for _, q in judge(todo).iterrows():
                quality[q["key"]] = q.to_dict()
            rendered += len([k for k in todo if k not in part_verdicts])  # a part's own rows are read back
        q = quality.get(cand.picture_key, {})
        verdict = q.get("quality_verdict", "failed")
        t.at[i, "admissible"] = ADMISSIBLE if verdict == WITHIN else INADMISSIBLE
        t.at[i, "why"] = f"quality {verdict}"
        if verdict == WITHIN:
            break
    lossless = {c.picture_key for c in t.candidate if c.lossless} - set(quality)
    if lossless:  # their pictures are the seeds' sampler's own: its rows against the converged solve, read back
        for _, q in judge(sorted(lossless)).iterrows():
            quality[q["key"]] = q.to_dict()
    t["judged_as"] = [c.picture_key for c in t.candidate]
    for col in ("quality_verdict", "adherence_delta", "adherence_delta_lo", "adherence_delta_hi", "fid_delta",
                "fid_delta_lo", "fid_delta_hi"):
        t[col] = [quality.get(c.picture_key, {}).get(col) for c in t.candidate]
    return t


def best(t: pd.DataFrame, lossless: bool = False) -> pd.Series | None:
    """The fastest admissible candidate; with `lossless`, the fastest lossless one whose speed clears the noise."""
    if lossless:
        ok = t[(t.speed_verdict == "faster") & t.candidate.map(lambda c: c.lossless)]
    else:
        ok = t[t.admissible == ADMISSIBLE]
    return ok.sort_values("speedup", ascending=False).iloc[0] if len(ok) else None


def timesteps(profile, scheduler_key: str, seed_steps: int = 50) -> list[float]:
    """The timesteps a candidate's loop calls the UNet at: its scheduler at its steps, else the profile's at 50."""
    from sdperf.config import architectures
    from sdperf.model.pipelines import make_scheduler

    name, steps = profile.scheduler, seed_steps
    if scheduler_key:
        tech = catalog.get(scheduler_key)
        name, steps = tech.sampler, tech.steps
    sched = make_scheduler(name, architectures.get(profile.arch).scheduler)
    sched.set_timesteps(steps, device="cpu")
    return [float(t) for t in sched.timesteps]


def pareto(points: pd.DataFrame, speed: str, quality: str, higher_is_better: bool) -> pd.DataFrame:
    """The non-dominated points: none other is at least as fast and at least as good, and better in one."""
    p = points.dropna(subset=[speed, quality])
    q = p[quality] if higher_is_better else -p[quality]
    keep = [not ((p[speed] >= s) & (q >= v) & ((p[speed] > s) | (q > v))).any() for s, v in zip(p[speed], q)]
    return p[pd.Series(keep, index=p.index, dtype=bool)].sort_values(speed)  # a plain empty list selects columns


def band_of(ratios: pd.DataFrame) -> tuple[float, float]:
    """The noise band of the per-image-at-50-steps ratio: the twin's, as every verdict here."""
    from sdperf.measure.rounds import TWIN

    return noise_band(ratios.loc[ratios.config == TWIN, "seed_speedup"])
