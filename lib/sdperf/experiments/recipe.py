"""10_ladder, second half: the fastest stack this CPU can run at a measured quality cost, and the lossless one.

The search (candidates, composed speed, budget, Pareto front) is sdperf.select.stack_search; this module runs it for a
study: the parts read back from the run's stand-alone rounds, their and each tried stack's quality on the reference
model (shared with 12 by key), the chosen stacks measured whole (the only figures the headline uses), and the
published CPU ladders beside them.
"""
from __future__ import annotations

from typing import Callable

import matplotlib.pyplot as plt
import pandas as pd

from sdperf.store import plots
from sdperf.select import scenarios, stack_search as ss
from sdperf.measure import half_budget
from sdperf.measure.comparison import Comparison, run_variants
from sdperf.core.errors import ConfigError
from sdperf.optimizations import catalog
from sdperf.measure.rounds import BASELINE
from sdperf.measure.study import Study
from sdperf.experiments.ladder import RANK

BEST, LOSSLESS = scenarios.BEST_STACK, scenarios.LOSSLESS_STACK
ROOF_GOAL_SHARE = 0.8  # the int8 executor's per-step gain should reach 80% of the int8-vs-fp32 roof ratio
TABLE_COLUMNS = ["key", "speedup", "speedup_lo", "speedup_hi", "speed_verdict", "s_per_image", "unet_calls",
                 "admissible", "why", "judged_as", "quality_verdict", "adherence_delta", "adherence_delta_lo", "adherence_delta_hi",
                 "fid_delta", "fid_delta_lo", "fid_delta_hi"]


def check(unets: list[str], schedulers: list[str], stages: list[str]) -> None:
    """Every key exists and sits on the side it is listed for, before anything runs."""
    for k in unets:
        if not ss.unet_side(k):
            raise ConfigError(f"search_unets: {k!r} is not a UNet configuration (families: "
                              f"{', '.join(ss.UNET_FAMILIES)})")
    for k, fams, name in [(k, (catalog.SCHEDULER,), "search_schedulers") for k in schedulers] + \
                         [(k, ss.STAGE_FAMILIES, "search_stages") for k in stages]:
        if catalog.get(k).family not in fams:
            valid = [key for f in fams for key in catalog.keys(family=f)]
            raise ConfigError(f"{name}: {k!r} is not of family {' or '.join(map(repr, fams))}; valid: {', '.join(valid)}")


def parts(study: Study, unets: list[str], stages: list[str], say: Callable[[str], None] = print) -> Comparison:
    """The parts' stand-alone rounds, read back where their notebooks measured them, else measured here."""
    return run_variants(study, list(unets) + list(stages), say=say, store=False)


def composed_table(study: Study, cmp: Comparison, unets: list[str], schedulers: list[str],
                   stages: list[str]) -> pd.DataFrame:
    """Every compatible candidate with its composed per-image speed-up over fp32 PLMS-50 (median, min-max)."""
    m = cmp.measured
    names = {catalog.BASELINE_KEY: BASELINE}
    names.update({r.key: r.variant for r in cmp.table.itertuples() if r.status == "ok"})
    steps = {s: ss.timesteps(study.profile, s) for s in [""] + list(schedulers)}
    steps.update({k: ss.timesteps(study.profile, k) for u in unets for k in catalog.split(u)
                  if catalog.get(k).owns_sampler})
    ok_unets = [u for u in unets if u in names]
    ok_stages = [g for g in stages if g in names]
    rows = []
    for cand in ss.candidates(ok_unets, schedulers, ok_stages):
        if not cand.key or cand.key == catalog.BASELINE_KEY:
            continue
        speed = ss.composed_speed(m.raw, m.ratios, names, cand, steps[cand.scheduler or cand.owner])
        if speed["status"] == "ok":
            rows.append({"key": cand.key, "candidate": cand, **speed})
    return pd.DataFrame(rows)


def part_verdicts(study: Study, keys: list[str], say: Callable[[str], None] = print) -> pd.DataFrame:
    """Each lossy part's own quality on the reference model (the rows 12's table shows too)."""
    from sdperf.quality.quality_settings import settings
    from sdperf.judge import techniques

    s = settings(study.profile)
    lossy = [k for k in keys if catalog.get(k).changes_output] + [techniques.SEEDS_SAMPLER]
    return techniques.for_study(study, lossy, techniques.Plan.of(s), say=say)


def search(study: Study, table: pd.DataFrame, band: tuple[float, float], verdicts: pd.DataFrame, *,
           max_quality: int, say: Callable[[str], None] = print) -> pd.DataFrame:
    """The search over `table`, judging stacks on the reference model through the run's shared quality rows."""
    from sdperf.quality.quality_settings import settings
    from sdperf.judge import techniques

    plan = techniques.Plan.of(settings(study.profile))
    known = dict(zip(verdicts.key, verdicts.quality_verdict)) if len(verdicts) else {}
    trusted, why = verdicts.attrs.get("trusted", (False, ["no controls were judged"]))

    def judge(keys: list[str]) -> pd.DataFrame:
        return techniques.for_study(study, keys, plan, say=say)

    return ss.search(table, band, judge, known, max_quality=max_quality, trusted=trusted, distrust="; ".join(why))


def reference_text(verdicts: pd.DataFrame) -> str:
    """The budget's reference in words: the converged fp32 solve and its steps (from the convergence rows)."""
    from sdperf.judge import converged, techniques

    per = verdicts.attrs.get("per_guidance")
    keys = sorted({k for k in per.key if str(k).startswith(techniques.REFERENCE)}) if per is not None and len(per) else []
    return (f"converged fp32 solve, {', '.join(catalog.get('scheduler:' + k.split(':', 1)[1]).label for k in keys)}"
            if keys else f"converged fp32 solve ({converged.SOLVER}), not judged in this run")


def judged_text(row, verdicts: pd.DataFrame) -> str:
    """What a chosen stack was judged against and every lossy part's own verdict, for the headline."""
    cand = row["candidate"]
    if cand.lossless:
        return (f"lossless: the seeds' fp32 pictures themselves ({catalog.get(cand.sampler).label}; its own verdict "
                f"against the {reference_text(verdicts)}: {_verdict_of(cand.sampler, verdicts)})")
    parts = "; ".join(f"{p} alone {_verdict_of(p, verdicts)}" for p in cand.lossy_parts)
    whole = row.get("quality_verdict")
    whole = whole if isinstance(whole, str) and whole else "not rendered"
    return f"judged against the {reference_text(verdicts)}; the stack whole {whole}; {parts}"


def _verdict_of(key: str, verdicts: pd.DataFrame) -> str:
    got = verdicts[verdicts.key == key] if len(verdicts) else verdicts
    return str(got.quality_verdict.iloc[0]) if len(got) else "not judged"


def verify(study: Study, chosen: dict[str, str], say: Callable[[str], None] = print) -> Comparison:
    """The chosen stacks measured whole: what composition cannot see (two engines in one process) is in these."""
    return run_variants(study, [(name, key) for name, key in chosen.items()], say=say)


def roof_ratio(study: Study) -> dict | None:
    """This CPU's int8-vs-f32 GEMM roof ratio (the engine's own kernels) as 08 recorded it this run, or None."""
    rows = study.recorder.current()
    if rows.empty or "metric" not in rows:
        return None
    ratio = rows[rows.metric == "roof_ratio"]
    if ratio.empty:
        return None
    r = ratio.iloc[-1]
    return {"ratio": float(r.value), "goal": ROOF_GOAL_SHARE * float(r.value), "scenario": r.scenario, "how": r.note}


def headline(cmp: Comparison, found: pd.DataFrame, name: str, roof: dict | None) -> dict | None:
    """One chosen stack's measured-whole figures, with the quality deltas of the search and the roof goal."""
    r = cmp.row(name)
    if r is None or r.get("status") != "ok":
        return None
    picture = catalog.join([k for k in catalog.split(r["key"]) if catalog.get(k).family != catalog.ALLOCATOR])
    q = found.set_index("key").loc[picture] if picture in set(found.key) else {}  # an allocator keeps the picture
    out = {"name": name, "key": r["key"], "per_image_speedup": r["seed_speedup"],
           "per_image_lo": r["seed_speedup_lo"], "per_image_hi": r["seed_speedup_hi"],
           "per_image_verdict": r.get("seed_speedup_verdict"), "s_per_image": r["s_per_image_seed"],
           "unet_step_speedup": r["unet_step_speedup"], "unet_step_lo": r["unet_step_speedup_lo"],
           "unet_step_hi": r["unet_step_speedup_hi"], "setup_s": r["setup_s"], "first_call_s": r["first_call_s"],
           "peak_memory_mib": r["process_peak_mib"], "method": r["method"]}
    for col in ("quality_verdict", "adherence_delta", "adherence_delta_lo", "adherence_delta_hi", "fid_delta",
                "fid_delta_lo", "fid_delta_hi"):
        out[col] = q.get(col) if hasattr(q, "get") else None
    if roof is not None:
        out.update(roof_ratio=roof["ratio"], roof_goal=roof["goal"],
                   roof_goal_met=bool(r["unet_step_speedup_lo"] >= roof["goal"]))
    return out


def record(study: Study, heads: list[dict], found: pd.DataFrame, verdicts: pd.DataFrame | None = None) -> None:
    """The headline rows per chosen stack, and a row per judged candidate with each lossy part's own verdict."""
    rows = []
    for h in heads:
        sc, common = scenarios.named(h["name"], h["key"]), dict(method=h["method"], key=h["key"], batch_size=1)
        rows += [dict(scenario=sc, metric="seed_speedup_vs_fp32", value=h["per_image_speedup"], lo=h["per_image_lo"],
                      hi=h["per_image_hi"], unit="x", verdict=h["per_image_verdict"],
                      note=f"per image at the stack's steps over fp32 eager PLMS 50; {h['per_image_verdict']}", **common),
                 dict(scenario=sc, metric="unet_step_speedup_vs_fp32", value=h["unet_step_speedup"],
                      lo=h["unet_step_lo"], hi=h["unet_step_hi"], unit="x", note="per UNet call", **common),
                 dict(scenario=sc, metric="s_per_image_seed", value=h["s_per_image"], unit="s", **common),
                 dict(scenario=sc, metric="setup", value=h["setup_s"], unit="s", note="cold, first round", **common),
                 dict(scenario=sc, metric="peak_memory", value=h["peak_memory_mib"], unit="MiB",
                      note="peak RSS of the stack's own worker process", **common)]
        if h.get("adherence_delta") is not None:
            rows.append(dict(scenario=sc, metric="reference_adherence_delta", value=h["adherence_delta"],
                             lo=h["adherence_delta_lo"], hi=h["adherence_delta_hi"], unit="",
                             note=f"trained reference model; {h['quality_verdict'] or ss.LOSSLESS_QUALITY}; "
                                  f"{h.get('judged', '')}".strip("; "), **common))
            rows.append(dict(scenario=sc, metric="reference_domain_fid_delta", value=h["fid_delta"],
                             lo=h["fid_delta_lo"], hi=h["fid_delta_hi"], unit="", **common))
        if h.get("roof_goal") is not None:
            rows.append(dict(scenario=sc, metric="roof_goal_x", value=h["roof_goal"], unit="x",
                             note=f"{ROOF_GOAL_SHARE:.0%} of the int8/fp32 roof ratio {h['roof_ratio']:.2f}x; "
                                  f"per-step range {'reaches' if h['roof_goal_met'] else 'misses'} it", **common))
    judged = found[found.admissible != ss.NOT_JUDGED]
    rows += [dict(scenario=scenarios.named(scenarios.SEARCH, r.key), metric="composed_seed_speedup_vs_fp32", value=r.speedup,
                  lo=r.speedup_lo, hi=r.speedup_hi, unit="x", key=r.key, method=ss.COMPOSED,
                  note=f"{r.admissible}: {r.why}" + (f"; {judged_text(pd.Series(r._asdict()), verdicts)}"
                                                      if verdicts is not None else ""))
             for r in judged.itertuples()]
    study.recorder.add_many(rows)


def show(found: pd.DataFrame) -> pd.DataFrame:
    return found[found.admissible != ss.NOT_JUDGED].reindex(columns=TABLE_COLUMNS).reset_index(drop=True)


def plot_front(study: Study, found: pd.DataFrame, heads: list[dict]):
    """Speed against adherence and against domain FID for every judged candidate, with each Pareto front; the speed
    axis is logarithmic only past a 10x span (a narrow span on a log axis reads as overlapping tick labels)."""
    pts = found[found.adherence_delta.notna() & (found.admissible != ss.NOT_JUDGED)].copy()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, col, better, label in ((axes[0], "adherence_delta", True, "adherence change (points of 1)"),
                                   (axes[1], "fid_delta", False, "domain FID change")):
        for adm, marker in ((ss.ADMISSIBLE, "o"), (ss.INADMISSIBLE, "x")):
            p = pts[pts.admissible == adm]
            ax.errorbar(p.speedup, p[col].astype(float), xerr=[p.speedup - p.speedup_lo, p.speedup_hi - p.speedup],
                        fmt=marker, ms=5, alpha=0.8, label=adm, capsize=2)
        front = ss.pareto(pts.assign(**{col: pts[col].astype(float)}), "speedup", col, better)
        ax.plot(front.speedup, front[col], color="grey", lw=1, ls="--", label="Pareto front")
        for h in heads:
            if h.get(col) is not None:
                ax.scatter([h["per_image_speedup"]], [h[col]], s=90, facecolors="none", edgecolors="black", zorder=4)
        ax.axhline(0, color="black", lw=0.5)
        scale = plots.ratio_scale(ax, [*pts.speedup, *pts.speedup_lo, *pts.speedup_hi,
                                       *[h["per_image_speedup"] for h in heads]], "x")
        ax.set(xlabel="per-image speed-up over fp32 PLMS-50 (composed" + ("; log)" if scale == "log" else ")"),
               ylabel=label)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"SD 1.5 speed ({study.env['device_name']}) vs quality on the trained reference model", fontsize=10)
    fig.tight_layout()
    from sdperf.quality.quality_settings import settings

    s = settings(study.profile)
    study.save_figure(fig, "stack_search_front",
                      what="The stack search: every candidate stack judged on the study's trained reference model, "
                      "its composed per-image speed-up (bars: min-max over rounds; log axis past a 10x span) against "
                      "its paired adherence change (left) and domain-FID change (right), admissible (o) or not (x), "
                      "the Pareto front dashed, the stacks then measured whole circled",
                      baseline="speed: fp32 eager PLMS 50 steps, interpolated per round; quality: the reference "
                      "model's converged fp32 solve of the same captions and noise",
                      method=f"speed: {ss.COMPOSED}; quality: paired deltas with 95% bootstrap intervals against the "
                      "converged solve (sdperf.judge.techniques)",
                      n=f"{len(pts)} candidate stack(s); quality over {s.reference_delta_step}-"
                      f"{s.reference_delta_images} paired images each (sequential: batches of "
                      f"{s.reference_delta_step} until the intervals settle); speed composed from the profile's "
                      f"{study.profile.rounds} rounds of each part's fresh processes")
    return fig


def published_ladders() -> pd.DataFrame:
    """The report's claims set beside one technique alone or the stack chosen here, per image over fp32 at batch 1;
    `measured_key` is the technique's catalog key, or the chosen stack's name."""
    from sdperf.report import published_vs_measured as pvm

    t = pvm.claims()
    t = t[(t.measured_metric == "seed_speedup_vs_fp32") & (t.measured_batch == "1") & t.published.notna()
          & ~t.measured_key.str.contains(r"[|+]")]
    return t.assign(measured_key=t.measured_key.where(t.measured_key != "", t.measured_scenario.str.rstrip(", ")))


def published_vs_measured(alone: pd.DataFrame, heads: list[dict]) -> pd.DataFrame:
    """Each published CPU ladder's step as a ratio over its own baseline, beside the same technique's ratio here:
    its stand-alone per-image figure at 50 PLMS steps, or the chosen stack's for a whole recipe."""
    pub = published_ladders()
    by_key = alone.set_index("key") if len(alone) else pd.DataFrame()
    by_name = {h["name"]: h for h in heads}
    out = []
    for r in pub.itertuples():
        measured, how = None, "not measured here"
        if isinstance(r.measured_key, str) and r.measured_key in by_name:
            h = by_name[r.measured_key]
            measured = h["per_image_speedup"]
            how = (f"{h['key']}: per image over fp32 PLMS-50, measured whole, [{h['per_image_lo']:.2f}-"
                   f"{h['per_image_hi']:.2f}] over rounds")
        elif isinstance(r.measured_key, str) and r.measured_key in by_key.index:
            a = by_key.loc[r.measured_key]
            if a.get("status") == "ok" and pd.notna(a.get("seed_speedup")):
                measured = float(a["seed_speedup"])
                how = (f"{r.measured_key} alone: per image at 50 steps (composed), [{a['seed_speedup_lo']:.2f}-"
                       f"{a['seed_speedup_hi']:.2f}], {a.get('seed_speedup_verdict')}")
            else:
                how = f"{r.measured_key}: {a.get('status')} {a.get('note') or ''}".strip()
        out.append({"source": r.source, "hardware": r.hardware, "settings": r.settings, "step": r.claim,
                    "published_x": r.published, "published_detail": r.published_detail,
                    "measured_here_x": measured, "measured_how": how, "why_they_differ": r.why_they_differ,
                    "url": r.url})
    return pd.DataFrame(out)


def faster_allocators(alloc: pd.DataFrame | None) -> list[str]:
    """The allocator settings whose own rung cleared the noise band by ladder.RANK: an allocator does not compose with
    the parts' figures, so the best stack is measured again under each."""
    column = f"{RANK}_verdict"
    if alloc is None or alloc.empty or column not in alloc:
        return []
    return [k for k, v in zip(alloc["key"], alloc[column]) if isinstance(k, str) and v == "faster"]


def run(study: Study, unets: list[str], schedulers: list[str], stages: list[str], *, max_quality: int,
        allocators: pd.DataFrame | None = None, say: Callable[[str], None] = print) -> dict:
    """The whole search: parts, their quality, every candidate composed and judged fastest first, then the best
    admissible and lossless stacks measured whole (and under each faster allocator of `allocators`)."""
    return finish(study, choose(study, unets, schedulers, stages, max_quality=max_quality, allocators=allocators,
                                say=say), say=say)


def choose(study: Study, unets: list[str], schedulers: list[str], stages: list[str], *, max_quality: int,
           allocators: pd.DataFrame | None = None, say: Callable[[str], None] = print) -> dict:
    """The search up to its choice: `chosen` ({name: stack}) is what finish() measures whole or reads back."""
    check(unets, schedulers, stages)
    skipped = half_budget.skips(study, unets, say=say)  # the ladder's rule: not measured up front either
    for key, why in skipped.items():
        say(f"{key}: left out of the search, skipped: {why}")
    unets = [u for u in unets if u not in skipped]
    cmp = parts(study, unets, stages, say=say)
    verdicts = part_verdicts(study, list(unets) + list(schedulers) + list(stages), say=say)
    say(f"quality reference: {reference_text(verdicts)}; controls "
        f"{'as required' if verdicts.attrs.get('trusted', (False,))[0] else 'FAILED: ' + '; '.join(verdicts.attrs.get('trusted', (False, ['not judged']))[1])}")
    table = composed_table(study, cmp, unets, schedulers, stages)
    band = ss.band_of(cmp.measured.ratios)
    found = search(study, table, band, verdicts, max_quality=max_quality, say=say) if len(table) else table
    picks = {BEST: ss.best(found) if len(found) else None, LOSSLESS: ss.best(found, lossless=True) if len(found)
             else None}
    chosen = {}
    for name, row in picks.items():
        if row is not None and row.key not in chosen.values():
            chosen[name] = row.key
    for name in [n for n in (BEST, LOSSLESS) if n in chosen]:  # an allocator keeps the picture: both get it
        for key in faster_allocators(allocators):
            chosen[f"{name} under {key}"] = catalog.join([*catalog.split(chosen[name]), key])
    return {"parts": cmp, "verdicts": verdicts, "found": found, "band": band, "picks": picks, "chosen": chosen,
            "skipped": skipped}


def finish(study: Study, search: dict, say: Callable[[str], None] = print) -> dict:
    """The chosen stacks measured whole (read back when already measured this run) and the headlines recorded."""
    chosen, found, verdicts, picks = search["chosen"], search["found"], search["verdicts"], search["picks"]
    whole = verify(study, chosen, say=say) if chosen else None
    roof = roof_ratio(study)
    heads = []
    for name, row in picks.items():
        if row is None:
            continue
        measured_as = next(n for n, k in chosen.items() if k == row.key)
        h = headline(whole, found, measured_as, roof)
        if h is not None:
            heads.append(dict(h, name=name, judged=judged_text(row, verdicts)))
    for name in [n for n in chosen if " under " in n]:
        h = headline(whole, found, name, roof)
        if h is not None:
            base = picks[name.split(" under ")[0]]
            heads.append(dict(h, judged=judged_text(base, verdicts)))
    record(study, heads, found, verdicts)
    return {**search, "whole": whole, "heads": heads, "roof": roof}
