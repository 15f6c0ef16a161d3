"""The best stack under the quality budget: every compatible combination, not a greedy walk one rung at a time.

A greedy ladder keeps a rung only if it is fast and harmless alone, so it never tries int8 with fewer steps when
int8 alone was "undecided". Here every compatible combination is a candidate: one configuration of the UNet
(fp32 eager, an executor, a precision, feature caching or token merging: each measured stand-alone in rounds),
one scheduler at a step count, and optionally an engine for the text encoder and VAE decoder.

How a candidate's speed is known. Measuring every combination in rounds would take hours, and the parts of a
generation are timed apart already (sdperf.measure.worker): per round, a candidate's per-image time is composed from
the measured parts of that round, the way every per-image figure at 50 steps in this study is composed:
text encoder + Σ UNet calls at the scheduler's step count (each call at the median of its kind: a caching
configuration's full and cached calls apart) + one scheduler step per call + VAE decode, the text encoder and
decode from the stage engine's worker when the candidate has one. The ratio divides the fp32 baseline at 50
PLMS steps, interpolated to the UNet configuration's worker as every ratio is. The scheduler's own arithmetic is
the profile scheduler's (PLMS), measured: under a millisecond next to a UNet call of seconds. What composition
cannot see (two engines sharing the caches of one process, an allocator) is why the chosen stacks are then
measured whole, in rounds of their own, and only those measurements make the headline.

How a candidate's quality is known (iso-quality a reviewer can defend). Every judgement is against the
converged fp32 solve of the same captions and noise on the trained reference model (sdperf.judge.techniques,
sdperf.judge.paired: adherence and soft adherence within 1 point, FID and KID where they resolve their margin).
A candidate's sampler is one of its parts: its scheduler, or fp32 PLMS at the seeds' 50 steps when it names none.
A candidate is admissible only when EVERY lossy part alone is "within budget" (a precision or executor judged with
the converged sampler, a sampler with fp32 weights) AND the stack rendered whole is too, so no part's "gain" can pay
for another part's loss; and only when the run's controls read as they must (an fp32 twin "within", known harms
"over"), else no candidate is admitted at all. Its speed range must also clear the noise floor. Candidates are
judged fastest first; one with a part that is not within alone is not rendered (its row names the part); a lossless
candidate (no technique may change the picture: the fp32 PLMS-50 pictures themselves) needs no rendering, and its
quality columns are its pictures' own: the seeds' sampler's rows against the converged solve (read back), never a
zero that would hide PLMS-50's own deficit. The search stops at the first admissible candidate, or after `max_quality` renderings.
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
                 catalog.GRAD_MODE)
ADMISSIBLE, INADMISSIBLE, PRUNED, NOT_JUDGED = "admissible", "not admissible", "not rendered", "not judged"
LOSSLESS_QUALITY = "lossless by declaration: no technique may change the picture"
COMPOSED = ("composed per round from the measured parts (text encoder + UNet calls at the scheduler's count, each at "
            "its kind's median + scheduler steps + VAE decode) over the fp32 baseline at 50 PLMS steps interpolated "
            "to the part's worker")


@dataclass(frozen=True)
class Candidate:
    """One combination: its UNet configuration's stack key ('' = fp32 eager), scheduler key ('' = the profile's
    scheduler at the seeds' 50 steps) and stage-engine key ('' = PyTorch's text encoder and decoder)."""

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
    def sampler(self) -> str:
        """Its sampler as a key: its scheduler, or fp32 PLMS at the seeds' steps (what the loop runs without one)."""
        from sdperf.judge.techniques import SEEDS_SAMPLER

        return self.scheduler or SEEDS_SAMPLER

    @property
    def lossy_parts(self) -> list[str]:
        """Every part that may change the picture, the sampler included: each must be within budget alone."""
        return [k for k in self.parts if catalog.get(k).changes_output and catalog.get(k).family != catalog.SCHEDULER] \
            + [self.sampler]

    @property
    def picture_key(self) -> str:
        """The stack of its parts that may change the picture, its sampler named: what its quality is judged by. A
        lossless part (an f32 stage engine, a lossless executor) adds nothing to judge, so two candidates that
        differ only in one share one rendering on the reference model (the search's renderings are its costliest
        step)."""
        return catalog.join(self.lossy_parts)


def unet_side(key: str) -> bool:
    """A stack that changes only how the UNet runs (what one worker's UNet calls measure)."""
    return all(t.family in UNET_FAMILIES for t in Stack.of(key).techniques)


def candidates(unets: list[str], schedulers: list[str], stages: list[str]) -> list[Candidate]:
    """Every combination of one UNet configuration (or eager), one scheduler (or the profile's at 50 steps) and
    one stage engine (or none) that the catalog lets stack."""
    out = []
    for u, s, g in itertools.product([""] + list(unets), [""] + list(schedulers), [""] + list(stages)):
        try:
            Stack.of([k for part in (u, g, s) if part for k in catalog.split(part)])
        except Exception:  # two of one family: not a stack
            continue
        out.append(Candidate(u, s, g))
    return out


# --- composed speed -----------------------------------------------------------------------------------------
def _stage(row, name: str, column: str) -> float:
    for s in row["stages"] or ():
        if s["stage"] == name:
            return float(s[column])
    return 0.0


def call_counts(kinds_of: Callable[[int], list[str]] | None, timesteps: list) -> dict[str, int]:
    kinds = kinds_of(timesteps) if kinds_of is not None else ["any"] * len(timesteps)
    return {k: kinds.count(k) for k in set(kinds)}


def composed_s(unet_row, stage_row, timesteps: list, kinds_of) -> float:
    """One image composed from one round's workers: text encoder and VAE decode from the stage engine's worker
    (else the UNet configuration's, whose decode a loop-only worker borrows from the baseline), each UNet call at
    its kind's median, one scheduler step per call."""
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
    """Per round: the fp32 baseline at 50 PLMS steps (interpolated to the UNet worker) over the candidate
    composed from that round's workers; median and min-max over rounds. `names` maps a stack key to its
    configuration name in `raw`."""
    unet_name = names.get(cand.unet or BASELINE_KEY)
    if unet_name is None or (cand.stages and cand.stages not in names):
        return {"status": "not measured"}
    urows = _rows(raw, unet_name)
    grows = _rows(raw, names[cand.stages]) if cand.stages else None
    kinds_of = Stack.of(cand.unet).call_kinds if cand.unet else None
    # the baseline of a worker: the run's fp32 PLMS-50 interpolated to it (rounds.per_round_ratios), or, for an
    # fp32-eager UNet side, the worker itself (a round holds several baseline workers)
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


# --- the search ---------------------------------------------------------------------------------------------
def failing_part(cand: Candidate, part_verdicts: dict[str, str]) -> tuple[str, str] | None:
    """The first lossy part of the candidate that is not within budget alone, with its verdict ("not judged" when
    no verdict is known): the candidate is then not admissible and not rendered."""
    from sdperf.judge.techniques import WITHIN

    for part in cand.lossy_parts:
        verdict = part_verdicts.get(part)
        if verdict != WITHIN:
            return part, verdict if isinstance(verdict, str) else "not judged"
    return None


def search(table: pd.DataFrame, band: tuple[float, float], judge: Callable[[list[str]], pd.DataFrame],
           part_verdicts: dict[str, str], *, max_quality: int, batch: int = 4, trusted: bool = True,
           distrust: str = "") -> pd.DataFrame:
    """Judge `table`'s candidates (columns: key, candidate, speedup, speedup_lo, speedup_hi) fastest first.

    `judge(keys)` renders stacks on the reference model and returns their quality rows (key, quality_verdict,
    adherence_delta..., fid_delta...); `part_verdicts` holds each lossy part's verdict alone. Without `trusted`
    controls no lossy candidate is admissible (`distrust` says why). Returns the table with each candidate's
    quality, its admissibility and why; the first admissible row in speed order is the best stack."""
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
    """The timesteps a candidate's loop calls the UNet at: its scheduler at its steps, or the profile's scheduler
    at the seeds' 50 (PLMS: 51 calls), from the architecture's noise-schedule configuration."""
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
