"""What each catalog technique costs in quality on the trained reference model, judged against the converged fp32
solve of the same captions and noise (sdperf.judge.converged), alone and stacked, with controls.

Random weights cannot say what int8, fewer steps, DeepCache or token merging do to a picture; the reference model
can. Each key is judged for what it alone changes: a stack that names a sampler runs it at its steps, any other
the converged solver at its steps; fp32 PLMS-50 (SEEDS_SAMPLER) is a row of its own; the controls run every time.
Per key and guidance, every paired measure of sdperf.judge.paired, n sized by power; a key's verdict is its worst
over the guidances. 10 and 12 share one measurement per run through results.csv (`for_study`).
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from sdperf.core import environment
from sdperf.model.pipelines import sampler_key
from sdperf.optimizations.quantization import CALIBRATION_SAMPLES
from sdperf.judge import controls, converged, paired, renders, technique_setup
from sdperf.refmodel import domain, domain_quality
from sdperf.judge.technique_setup import GUIDANCE, RENDER_BATCH, SOLVE_BATCH
from sdperf.judge.paired import ADHERENCE_BUDGET, OVER, UNDECIDED, WITHIN

SEEDS_STEPS = 50  # the seeds' PLMS step count
SEEDS_SAMPLER = f"scheduler:plms@{SEEDS_STEPS}"
REFERENCE = "converged"  # key prefix of the reference's own rows: converged:<solver>@<steps>
FASTEST_DEFAULT = ("euler", 10)  # the convergence tolerance's candidate when no scheduler key is judged
SEVERITY = {WITHIN: 0, UNDECIDED: 1, OVER: 2}
METHOD = ("reference model, paired per image against the converged fp32 solve of the same captions and noise; "
          "adherence, soft adherence, latent MSE, SSIM: BCa bootstrap 95%; FID, KID: paired percentile bootstrap "
          "recentred on the estimate; images in batches until the adherence intervals settle (sequential n)")
MEASURES = (  # (metric, table column, its interval's columns or None, unit)
    ("reference_adherence", "adherence", ("adherence_lo", "adherence_hi"), "share"),
    ("reference_adherence_delta", "adherence_delta", ("adherence_delta_lo", "adherence_delta_hi"), "share"),
    ("reference_soft_adherence_delta", "soft_adherence_delta",
     ("soft_adherence_delta_lo", "soft_adherence_delta_hi"), "share"),
    ("reference_latent_mse", "latent_mse", ("latent_mse_lo", "latent_mse_hi"), ""),
    ("reference_image_ssim", "ssim", ("ssim_lo", "ssim_hi"), ""),
    ("reference_domain_fid", "domain_fid", None, ""),
    ("reference_domain_fid_delta", "fid_delta", ("fid_delta_lo", "fid_delta_hi"), ""),
    ("reference_fid_margin", "fid_margin", None, ""),
    ("reference_kid", "kid", None, ""),
    ("reference_kid_delta", "kid_delta", ("kid_delta_lo", "kid_delta_hi"), ""),
    ("reference_kid_margin", "kid_margin", None, ""),
)


@dataclass(frozen=True)
class Plan:
    """How a run judges: guidances, the sequential test's batch and cap, the controls' noise doses."""

    guidances: tuple[float, ...] = (GUIDANCE,)
    n_max: int = 256
    n_step: int = 64
    doses: tuple[float, ...] = (2.0, 4.0)  # the profiles' (params/*.yml say what each cost on the reference model)
    ladder: tuple[int, ...] = converged.LADDER  # the convergence check's step counts (smoke and tests: shorter)
    check_images: int = converged.CHECK_IMAGES
    independent_steps: int = converged.INDEPENDENT_STEPS  # the independent leg's steps (converged.INDEPENDENT)
    key_budget_s: float | None = None  # most seconds a key's first batch may take here, predicted from its own calls
    calibration_samples: int = CALIBRATION_SAMPLES  # UNet calls a calibrated int8 key collects
    fallbacks: int | None = None  # alternatives judged per key over the budget alone, in catalog order (None: all)

    @classmethod
    def of(cls, s) -> "Plan":
        """From the profile's validated quality settings (sdperf.quality.quality_settings)."""
        return cls(guidances=tuple(s.reference_judge_guidances), n_max=s.reference_delta_images,
                   n_step=s.reference_delta_step, doses=tuple(s.reference_noise_doses),
                   ladder=tuple(s.reference_convergence_steps), check_images=s.reference_check_images,
                   independent_steps=s.reference_independent_steps, key_budget_s=s.reference_key_budget_s,
                   calibration_samples=s.reference_calibration_samples, fallbacks=s.reference_fallbacks)

    def text(self) -> str:
        few = sampler_key(converged.SOLVER, controls.FEW_STEPS)
        return (f"guidance {', '.join(f'{g:g}' for g in self.guidances)}; images in batches of {self.n_step} up to "
                f"{self.n_max}; controls: fp32 twin, {few}, UNet-output noise "
                f"{', '.join(f'{d:g}' for d in self.doses)}")


def fastest_sampler(keys: list[str]) -> tuple[str, int]:
    """The fewest-steps sampler among FASTEST_DEFAULT and the keys' schedulers: it sets the convergence tolerance."""
    from sdperf.optimizations import catalog

    found = [(t.steps, t.sampler) for k in keys for t in catalog.Stack.of(k).techniques
             if t.family == catalog.SCHEDULER and t.steps]
    name, steps = FASTEST_DEFAULT  # always a candidate, and preferred on a tie: the tolerance stays put across calls
    steps, name = min(found + [(steps, name)], key=lambda f: (f[0], f[1] != FASTEST_DEFAULT[0]))
    return name, steps


@dataclass
class _Reference:
    """One guidance's converged solve, judged, growing as keys ask for more images."""

    solver: converged.Solver
    convergence: converged.Convergence
    net: object
    captions: list[str]
    seeds: list[int]
    truth: np.ndarray
    judged: paired.Judged | None = None

    def first(self, n: int) -> paired.Judged:
        if self.judged is None or len(self.judged) < n:
            s = self.solver.solve(self.captions[:n], self.seeds[:n], self.convergence.steps)
            self.judged = paired.Judged.of(self.net, s.latents, s.images, self.truth[:n])
        return self.judged.take(n)


class OverBudget(Exception):
    """A key whose first batch would take longer than the plan's key_budget_s here: skipped, naming the prediction."""

    def __init__(self, predicted_s: float, per_call_s: float, calls: int, budget_s: float, n: int,
                 timed_on: str = "its second call"):
        self.predicted_s = predicted_s
        super().__init__(f"its first {n} images would take about {predicted_s:.0f} s here ({calls} calls of "
                         f"{per_call_s:.1f} s, timed on {timed_on}) against the profile's "
                         f"reference_key_budget_s of {budget_s:g} s: not judged on this machine")


def reference_key(steps: int) -> str:
    """The reference's own rows' key: converged:<sampler>@<steps>[:<spacing>]."""
    return f"{REFERENCE}:{sampler_key(converged.SOLVER, steps)}"


def _worst(verdicts) -> str:
    vs = [v for v in verdicts if v in SEVERITY]
    return max(vs, key=SEVERITY.get) if vs else UNDECIDED


def measure(keys: list[str], base_profile, *, plan: Plan, folder: Path | None = None, scratch: Path | None = None,
            say: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per (stack or control key, guidance) against the converged solve, the reference's own appended."""
    from sdperf.measure.comparison import release
    from sdperf.optimizations.catalog import Stack
    from sdperf.model.pipelines import build_from_weights, timestep_span
    from sdperf.refmodel import storage

    known = {c.key: c for c in controls.defaults(plan.doses)}
    bad = [k for k in keys if controls.is_control(k) and k not in known]
    if bad:
        raise ValueError(f"control {bad[0]!r} is not one of this plan's: {', '.join(known)}")
    stacks = {k: Stack.of(k) for k in keys if k not in known}  # an unknown key fails before any model is loaded
    folder = Path(folder or storage.default_dir())
    _, net, manifest = storage.load(folder, scheduler=None)  # verified once; each technique loads the same files
    real = domain_quality.Real.of(net, manifest["recipe"]["evaluator_held_out"])
    items = domain_quality.prompts(plan.n_max)
    captions, truth, seeds = [s.caption for s in items], domain.labels_many(items), list(range(plan.n_max))
    cache = converged.cache_dir(scratch.parent) if scratch else None

    def fresh(sampler: str):
        return build_from_weights(str(folder), sampler)

    solver_pipe = functools.cache(fresh)  # the solves' own fp32 pipelines, one per sampler: nothing patches them

    def render_solve(sampler: str, steps: int, caps: list[str], sds: list[int], g: float) -> converged.Solve:
        return converged.Solve(*domain_quality.generate_with_latents(solver_pipe(sampler), caps, sds, g, steps,
                                                                     batch=SOLVE_BATCH, pad=False))

    fastest = fastest_sampler(list(stacks))
    schedule = solver_pipe(converged.SOLVER).scheduler.sdperf_model_config  # the model's noise schedule
    refs, conv_rows, former_rows = {}, [], []
    for g in plan.guidances:
        solver = converged.Solver(lambda s, n, c, d, g=g: render_solve(s, n, c, d, g), converged.model_hash(manifest),
                                  g, cache, schedule)
        check = min(plan.check_images, plan.n_max)
        conv = converged.converge(solver, captions[:check], seeds[:check], fastest, ladder=plan.ladder,
                                  independent=(converged.INDEPENDENT, plan.independent_steps))
        say(f"guidance {g:g}: {conv.text()}")
        refs[g] = _Reference(solver, conv, net, captions, seeds, truth)
        conv_rows += [dict(guidance=g, chosen=conv.steps, converged=conv.converged, fastest=conv.fastest, **r)
                      for r in conv.rows]
        if conv.former is not None:
            former_rows.append(dict(guidance=g, fastest=conv.fastest, independent=conv.independent,
                                    n_images=check, **conv.former))

    rows = []
    machine, mhash = environment.fingerprint("cpu"), converged.model_hash(manifest)
    stored = renders.cache_dir(scratch.parent) if scratch else None
    n_converged = refs[plan.guidances[0]].convergence.steps  # the steps a key that names no sampler renders at
    for key in keys:
        control, stack = known.get(key), stacks.get(key)
        row = dict(key=key, label=control.label if control else stack.label,
                   family="control" if control else ", ".join(t.family for t in stack.techniques))
        ctx = technique_setup.context(base_profile, folder, n_converged, scratch, plan.calibration_samples)
        if stack is not None:
            ok, reason = stack.availability(ctx)
            if not ok:
                say(f"{key}: not applicable: {reason}")
                rows += [dict(row, guidance=g, status="not_applicable", note=f"not applicable: {reason}")
                         for g in plan.guidances]
                continue
        built = {}

        def pipe():  # built on the first batch the render cache lacks, once for every guidance
            if "pipe" not in built:
                built["pipe"] = technique_setup.build(control, stack, ctx, fresh)
            return built["pipe"]

        steps, grad_mode, batch, aligned = technique_setup.how(control, stack, n_converged)
        first, last = timestep_span(technique_setup.sampler(control, stack), steps, schedule)
        try:
            for g in plan.guidances:
                ref = refs[g]
                call = dict(batch=batch, pad=control is None, grad_mode=grad_mode)
                if stack is not None and stack.calibrated:  # its IR, so its pictures, depend on the calibration size
                    call["calibration_samples"] = ctx.calibration_samples
                cache = renders.Cache(None if control else stored, mhash + technique_setup.inputs_digest(stack, folder),
                                      machine, key, steps, g, call,
                                      facts=ctx.facts)  # controls: rendered live
                got = _sequential(pipe, steps, grad_mode, g, ref, plan, real, batch, aligned, pad=control is None,
                                  cache=cache)
                rows.append(dict(row, guidance=g, status="ok", steps=steps, cached_images=cache.hits,
                                 first_timestep=first, last_timestep=last, note=_facts(ctx.facts), **got))
                r = rows[-1]
                said = f" ({cache.hits} read back from the render cache)" if cache.hits else ""
                say(f"{key} @ {g:g}: n={r['n_images']}{said}, adherence {r['adherence_delta']:+.4f} "
                    f"[{r['adherence_delta_lo']:+.4f}, {r['adherence_delta_hi']:+.4f}], soft "
                    f"{r['soft_adherence_delta']:+.4f}, latent MSE {r['latent_mse']:.4f}: {r['quality_verdict']}")
        except Exception as exc:  # recorded, at every guidance not done; the other keys still run
            if isinstance(exc, OverBudget):  # the same calls cost the same at another guidance
                status, note = "skipped", f"skipped: {exc}"
                say(f"{key}: {note}")
            else:
                status, note = "failed", f"{type(exc).__name__}: {exc}"[:500]
                say(f"{key}: failed: {note[:300]}")
            done = {r["guidance"] for r in rows if r["key"] == key}
            rows += [dict(row, guidance=g, status=status, note=note) for g in plan.guidances if g not in done]
        finally:
            built.clear()
            release()
    table = pd.DataFrame(rows)
    for g, ref in refs.items():  # the reference's own absolute figures, at the most images any key used
        most = table.loc[table.guidance == g, "n_images"].max() if "n_images" in table else None
        n = plan.n_step if most is None or pd.isna(most) else int(most)  # no key judged here: one batch's worth
        base = ref.first(n)
        first, last = ref.solver.span(converged.SOLVER, ref.convergence.steps)
        own = dict(key=reference_key(ref.convergence.steps), label=ref.convergence.text(), family="reference",
                   guidance=g, status="ok", steps=ref.convergence.steps, n_images=n, first_timestep=first,
                   last_timestep=last, **_absolute(base, real))
        table = pd.concat([table, pd.DataFrame([own])], ignore_index=True)
    table.attrs.update(manifest_commit=manifest["commit"], convergence=pd.DataFrame(conv_rows),
                       former=pd.DataFrame(former_rows), cache_hits=sum(r.solver.hits for r in refs.values()),
                       cache_made=sum(r.solver.made for r in refs.values()))
    return table


def _sequential(pipe: Callable, steps: int, grad_mode: str, guidance: float, ref: _Reference, plan: Plan,
                real: domain_quality.Real, batch: int = RENDER_BATCH, aligned: bool = False, pad: bool = True,
                cache: renders.Cache | None = None) -> dict:
    """Images in batches of plan.n_step until paired.settled or plan.n_max; `aligned`: the whole prefix again each
    time, in the reference's chunks; `pad`: every call at `batch` prompts; `cache`: earlier batches read back."""
    def render(caps: list[str], seeds: list[int]) -> converged.Solve:
        return converged.Solve(*domain_quality.generate_with_latents(pipe(), caps, seeds, guidance, steps,
                                                                     batch=batch, grad_mode=grad_mode, pad=pad))

    done: list[converged.Solve] = []
    n = 0
    while True:
        stop = min(n + plan.n_step, plan.n_max)
        if aligned:
            done = [converged.Solver(lambda _s, _n, c, d: render(c, d), "", guidance).solve(
                ref.captions[:stop], ref.seeds[:stop], steps)]
        else:
            done.append(_batch(n, stop, render, pipe, ref, plan, batch, cache))
        n = stop
        got = converged.Solve.cat(done)
        judged = paired.Judged.of(ref.net, got.latents, got.images, ref.truth[:n])
        base = ref.first(n)
        settled = paired.settled(judged.adherence - base.adherence, judged.soft - base.soft)
        if settled or n >= plan.n_max:
            break
    return dict(paired.measures(judged, base, real), settled=bool(settled))


def _batch(lo: int, stop: int, render: Callable, build: Callable, ref: _Reference, plan: Plan, batch: int,
           cache: renders.Cache | None) -> converged.Solve:
    """Images lo..stop from `cache`, else rendered (the build untimed: set-up is not what the gate predicts)."""
    caps, seeds = ref.captions[lo:stop], ref.seeds[lo:stop]
    hit = cache.get(caps, seeds) if cache is not None else None
    if hit is not None:
        return hit
    build()
    parts = (_gated_first_batch(render, ref, plan, batch) if lo == 0 and plan.key_budget_s is not None
             else [render(caps, seeds)])
    got = converged.Solve.cat(parts)
    if cache is not None:
        cache.put(caps, seeds, got)
    return got


def _gated_first_batch(render, ref: _Reference, plan: Plan, batch: int) -> list[converged.Solve]:
    """The first batch call by call: OverBudget when the second call (or the first alone) predicts it over budget."""
    stop = min(plan.n_step, plan.n_max)
    calls, done = -(-stop // batch), []
    for j, i in enumerate(range(0, stop, batch)):
        t0 = time.perf_counter()
        done.append(render(ref.captions[i:min(i + batch, stop)], ref.seeds[i:min(i + batch, stop)]))
        took = time.perf_counter() - t0
        if j == 0 and calls > 1 and took > plan.key_budget_s:
            raise OverBudget(took * calls, took, calls, plan.key_budget_s, stop, "its first call, set-up included")
        if (j == 1 or calls == 1) and took * calls > plan.key_budget_s:
            raise OverBudget(took * calls, took, calls, plan.key_budget_s, stop)
    return done


def _absolute(base: paired.Judged, real: domain_quality.Real) -> dict:
    mean, lo, hi = domain_quality.mean_interval(base.adherence)
    return dict(adherence=mean, adherence_lo=lo, adherence_hi=hi, soft_adherence=float(base.soft.mean()),
                domain_fid=domain_quality.domain_fid(base.features, real), kid=paired.kid(base.features, real.features))


def _facts(facts: dict) -> str:
    return "; ".join(f"{k}={v}" for k, v in facts.items() if k not in ("setup_peak_mib",))[:300]


SCENARIO = "quality vs the converged solve"
CACHED = ("of the row's images, those read back from the render cache of an earlier run on this machine "
          "(sdperf.judge.renders: same model, technique code, libraries, captions and noise); the rest were "
          "rendered in this run; controls are always rendered")
CONVERGENCE = "converged reference"
FORMER = "former reference"  # the study's earlier reference, measured against the independent solve


def _scenario(key: str, guidance: float) -> str:
    return f"{SCENARIO}: {key}, guidance {guidance:g}"


def record(study, table: pd.DataFrame) -> None:
    """The table (and its convergence check) as results rows under the calling notebook, each with its key."""
    rows = []
    for r in table.to_dict("records"):
        common = dict(scenario=_scenario(r["key"], r["guidance"]), key=r["key"], method=METHOD)
        if r["status"] != "ok":
            rows += [dict(common, metric="reference_adherence_delta", value=None, unit="", status=r["status"],
                          note=str(r["note"])[:500]),
                     dict(common, metric="reference_guidance", value=float(r["guidance"]), unit="")]
            continue
        n = int(r["n_images"])
        for metric, col, ci, unit in MEASURES:
            if col not in r or r[col] is None or (isinstance(r[col], float) and math.isnan(r[col])):
                continue
            extra = dict(lo=r[ci[0]], hi=r[ci[1]]) if ci else {}
            rows.append(dict(common, metric=metric, value=float(r[col]), unit=unit, n=n, **extra,
                             note=str(r.get("label") or "")[:300] if metric == "reference_adherence" else
                             ("stopped at the image cap before the intervals settled"
                              if r.get("settled") is False else "")))
        rows.append(dict(common, metric="reference_sampler_steps", value=float(r["steps"]), unit="steps", n=n,
                         note="the steps its sampler ran: its own scheduler's, else the converged solve's"))
        rows.append(dict(common, metric="reference_guidance", value=float(r["guidance"]), unit="", n=n))
        rows += _span_rows(common, r, n)
        if not str(r["key"]).startswith(REFERENCE):  # the reference's own images are the solves cache's
            rows.append(dict(common, metric="reference_cached_images", value=float(_count(r.get("cached_images"))),
                             unit="images", n=n, note=CACHED))
        if "psnr_db_median" in r and not pd.isna(r.get("psnr_db_median")):
            rows.append(dict(common, metric="reference_image_psnr_db", value=_finite(r["psnr_db_median"]), unit="dB",
                             p10=_finite(r["psnr_db_p10"]), n=n, note="median over images vs the converged twin "
                             "(p10: 10th percentile); " + ("identical" if math.isinf(r["psnr_db_median"]) else
                                                            "8-bit images")))
    rows += convergence_rows(table.attrs.get("convergence"), table.attrs.get("former"))
    study.recorder.add_many(rows)


SPAN_METHOD = "the sampler's timesteps at its step count on the model's noise schedule (set_timesteps)"


def _span_rows(common: dict, r: dict, n: int | None) -> list[dict]:
    """The first and last timestep a row's sampler called the UNet at."""
    out = []
    for end in ("first", "last"):
        v = r.get(f"{end}_timestep")
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out.append(dict(common, metric=f"reference_{end}_timestep", value=float(v), unit="t", n=n,
                            method=SPAN_METHOD))
    return out


def _legs_method(what: str) -> str:
    return f"latent MSE per element, mean over images, against {what}"


def convergence_rows(conv: pd.DataFrame | None, former: pd.DataFrame | None) -> list[dict]:
    """Both legs of the convergence check per step count, and the former reference's distance, as results rows."""
    rows = []
    for c in ([] if conv is None else conv.to_dict("records")):
        sc = f"{CONVERGENCE}: {converged.SOLVER}, guidance {c['guidance']:g}"
        key = reference_key(c["steps"])
        chosen = bool(c["steps"] == c["chosen"] and c["converged"])
        double = dict(scenario=sc, key=key, n=c["n_images"], method=_legs_method(f"the {c['doubled']}-step solve"))
        ind = dict(double, method=_legs_method(f"the independent {c['independent']} solve from the same noise"))
        passes = {leg: "within" if c[leg] < converged.SHARE else "NOT within" for leg in ("share", "independent_share")}
        rows += [dict(double, metric="convergence_moved_mse", value=c["moved_mse"], unit="",
                      note=f"{c['steps']} -> {c['doubled']} steps"),
                 dict(double, metric="convergence_fastest_mse", value=c["fastest_mse"], unit="",
                      note=f"{c['fastest']} against the {c['doubled']}-step solve"),
                 dict(double, metric="convergence_share", value=c["share"], unit="share",
                      note=f"doubling leg, {passes['share']} the {converged.SHARE:.0%} tolerance"),
                 dict(ind, metric="convergence_independent_mse", value=c["independent_mse"], unit="",
                      note=f"{key.split(':', 1)[1]} against {c['independent']}"),
                 dict(ind, metric="convergence_fastest_independent_mse", value=c["fastest_independent_mse"], unit="",
                      note=f"{c['fastest']} against {c['independent']}"),
                 dict(ind, metric="convergence_independent_share", value=c["independent_share"], unit="share",
                      note=f"independent leg, {passes['independent_share']} the {converged.SHARE:.0%} tolerance"),
                 dict(double, metric="convergence_steps", value=float(c["steps"]), unit="steps"),
                 dict(double, metric="convergence_guidance", value=float(c["guidance"]), unit=""),
                 dict(double, metric="convergence_chosen", value=float(chosen), unit="",
                      note="both legs within the tolerance: the reference's steps" if chosen else
                      "not chosen: " + ("a leg is not within the tolerance" if not c["converged"] or
                                        c["steps"] != c["chosen"] else ""))]
        rows += _span_rows(dict(double, method=SPAN_METHOD), c, c["n_images"])
        for end in ("first", "last"):
            v = c.get(f"independent_{end}_timestep")
            if v is not None and not pd.isna(v):
                rows.append(dict(ind, metric=f"convergence_independent_{end}_timestep", value=float(v), unit="t",
                                 method=SPAN_METHOD, note=c["independent"]))
    for f in ([] if former is None else former.to_dict("records")):
        common = dict(scenario=f"{FORMER}: {f['key']}, guidance {f['guidance']:g}", key=f"{REFERENCE}:{f['key']}",
                      n=f["n_images"], method=_legs_method(f"the independent {f['independent']} solve from the "
                                                            "same noise"))
        rows += [dict(common, metric="convergence_former_independent_mse", value=f["mse"], unit="",
                      note="the study's reference before issue 60 (the model's leading spacing)"),
                 dict(common, metric="convergence_former_independent_share", value=f["share"], unit="share",
                      note=f"of {f['fastest']}'s distance to {f['independent']}"),
                 dict(common, metric="convergence_guidance", value=float(f["guidance"]), unit="")]
        rows += _span_rows(dict(common, method=SPAN_METHOD), f, f["n_images"])
    return rows


def reuse_sentence(results) -> str | None:
    """What the judging read back from the render cache instead of rendering; None without such rows."""
    rows = results[results["metric"] == "reference_cached_images"] if "metric" in results else results.iloc[:0]
    rows = rows[(rows["status"] == "ok") & ~rows["key"].astype(str).map(
        lambda k: controls.is_control(k) or k.startswith(REFERENCE))]
    if rows.empty:
        return None
    read, judged = int(rows["value"].sum()), int(rows["n"].sum())
    whole = int((rows["value"] >= rows["n"]).sum())
    return (f"Render cache: {read:,} of the {judged:,} technique images judged against the converged solve "
            f"({len(rows)} key-and-guidance rows, {whole} of them wholly) were read back from an earlier run on this "
            f"machine (same model, technique code, libraries, captions and noise) instead of rendered; the controls "
            f"are rendered in every run.")


def _count(x) -> int:
    return 0 if x is None or (isinstance(x, float) and math.isnan(x)) else int(x)


def _finite(x: float) -> float | None:
    """results.csv holds no inf: an identical image's PSNR is stored empty, its note says identical."""
    return None if math.isinf(x) else float(x)


def from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """`measure`'s table rebuilt from results rows, verdicts recomputed from the interval columns (paired.decide)."""
    if rows.empty or "scenario" not in rows:
        return pd.DataFrame()
    t = rows[rows.scenario.astype(str).str.startswith(SCENARIO + ": ")]
    out = []
    for scenario, g in t.groupby("scenario", sort=False):
        by = {m: r for m, r in zip(g.metric, g.itertuples())}
        if "reference_guidance" not in by:
            continue
        guidance = float(by["reference_guidance"].value)
        key = g.key.iloc[0]
        first = by.get("reference_adherence_delta") or by.get("reference_adherence")
        if first is None:
            continue
        row = dict(key=key, guidance=guidance, status=first.status, note=first.note)
        if first.status == "ok":
            row["n_images"] = int(first.n)
            for metric, col, ci, _ in MEASURES:
                if metric in by:
                    row[col] = by[metric].value
                    if ci:
                        row[ci[0]], row[ci[1]] = by[metric].lo, by[metric].hi
            if "reference_adherence" in by:
                row["label"] = by["reference_adherence"].note
            p = by.get("reference_image_psnr_db")
            if p is not None:
                row["psnr_db_median"] = math.inf if pd.isna(p.value) else p.value
                row["psnr_db_p10"] = math.inf if pd.isna(p.p10) else p.p10
            if "adherence_delta_lo" in row and "fid_margin" in row:
                row.update(paired.decide(row))
            for metric, col in (("reference_sampler_steps", "steps"), ("reference_cached_images", "cached_images")):
                if metric in by:
                    row[col] = int(by[metric].value)
        out.append(row)
    return pd.DataFrame(out)


def _scenarios(rows: pd.DataFrame, prefix: str) -> list[tuple[str, dict]]:
    """(key, {metric: value}) for each scenario of `rows` named `prefix: ...`, in row order."""
    if rows.empty or "scenario" not in rows:
        return []
    t = rows[rows.scenario.astype(str).str.startswith(prefix + ": ")]
    return [(key, dict(zip(g.metric, g.value))) for (_, key), g in t.groupby(["scenario", "key"], sort=False)]


def convergence_from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The convergence check from results rows: per guidance and step count, both legs and whether it was chosen."""
    out = []
    for key, by in _scenarios(rows, CONVERGENCE):
        if "convergence_steps" not in by or "convergence_guidance" not in by:
            continue
        out.append(dict(guidance=float(by["convergence_guidance"]), key=key, steps=int(by["convergence_steps"]),
                        moved_mse=by.get("convergence_moved_mse"), fastest_mse=by.get("convergence_fastest_mse"),
                        share=by.get("convergence_share"), independent_mse=by.get("convergence_independent_mse"),
                        fastest_independent_mse=by.get("convergence_fastest_independent_mse"),
                        independent_share=by.get("convergence_independent_share"),
                        first_timestep=by.get("reference_first_timestep"),
                        last_timestep=by.get("reference_last_timestep"), chosen=bool(by.get("convergence_chosen"))))
    return pd.DataFrame(out)


def former_from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The former reference's distance to the independent solve, per guidance, from results rows."""
    out = []
    for key, by in _scenarios(rows, FORMER):
        if "convergence_former_independent_mse" in by and "convergence_guidance" in by:
            out.append(dict(guidance=float(by["convergence_guidance"]), key=key,
                            mse=by["convergence_former_independent_mse"],
                            share=by.get("convergence_former_independent_share"),
                            first_timestep=by.get("reference_first_timestep"),
                            last_timestep=by.get("reference_last_timestep")))
    return pd.DataFrame(out)


def convergence_sentence(rows: pd.DataFrame) -> str | None:
    """The reference in words at the first guidance checked, with both legs and the former's; None without rows."""
    conv = convergence_from_rows(rows)
    if conv.empty:
        return None
    at = conv[conv.guidance == conv.guidance.iloc[0]]
    chosen = at[at.chosen.astype(bool)]
    r = (chosen if len(chosen) else at).iloc[-1]
    notes = dict(zip(rows.loc[rows.key == r.key, "metric"], rows.loc[rows.key == r.key, "note"].astype(str)))
    fastest = notes.get("convergence_fastest_mse", "the fastest candidate").split(" against ")[0]
    span = "" if pd.isna(r.first_timestep) else f", t {int(r.first_timestep)} -> {int(r.last_timestep)}"
    head = f"The reference: {r.key.split(':', 1)[1]}{span} at guidance {r.guidance:g}"
    double = (f"doubling its steps moves its final latents by {float(r.moved_mse):.2e} (MSE), {float(r.share):.1%} "
              f"of {fastest}'s distance")
    if pd.isna(r.independent_share):  # rows of a run without the independent solve: doubling was its only check
        return f"{head}, checked by doubling only: {double}; these rows hold no independent solve."
    independent = notes.get("convergence_independent_mse", "").split(" against ")[-1] or "an independent solver"
    text = (f"{head}, {'converged' if len(chosen) else 'NOT converged, so no stack is admitted'}: {double}; the "
            f"independent {independent} solve from the same noise lies {float(r.independent_mse):.2e} from it, "
            f"{float(r.independent_share):.1%} of {fastest}'s distance to it (each must be < {converged.SHARE:.0%}).")
    former = former_from_rows(rows)
    former = former[former.guidance == r.guidance] if len(former) else former
    if len(former):
        f = former.iloc[0]
        fspan = "" if pd.isna(f.first_timestep) else f", t {int(f.first_timestep)} -> {int(f.last_timestep)}"
        text += (f" The reference before issue 60 ({f.key.split(':', 1)[1]}{fspan}) lies {float(f.mse):.2e} from "
                 f"that independent solve, {float(f.share):.1%} of {fastest}'s distance.")
    return text


def converged_at(convergence: pd.DataFrame, guidances: tuple[float, ...]) -> tuple[bool, list[str]]:
    """Whether the reference passed both legs of its convergence check at every guidance, and why not."""
    bad = []
    for g in guidances:
        at = convergence[convergence.guidance == g] if len(convergence) else convergence
        if at.empty:
            bad.append(f"guidance {g:g}: the reference's convergence was not checked")
        elif not at.chosen.astype(bool).any():
            last = at.iloc[-1]
            bad.append(f"guidance {g:g}: the reference is not converged by {int(last.steps)} steps (doubling "
                       f"{float(last.share):.1%}, independent solve {float(last.independent_share):.1%} of the "
                       f"fastest candidate's distance; each must be < {converged.SHARE:.0%})")
    return not bad, bad


def overall(table: pd.DataFrame, guidances: tuple[float, ...] = (GUIDANCE,)) -> pd.DataFrame:
    """One row per key: the numbers at the first guidance, the verdict the worst over all, each one's verdict."""
    if table.empty:
        return table
    first, out = guidances[0], []
    for key, g in table.groupby("key", sort=False):
        rows = g.set_index("guidance")
        main = rows.loc[first] if first in rows.index else rows.iloc[0]
        row = main.to_dict()
        row["key"] = key
        if (g.status == "ok").all() and "quality_verdict" in g and g.quality_verdict.notna().all():
            row["quality_verdict"] = _worst(g.quality_verdict)
            row["verdict_by_guidance"] = "; ".join(f"{gd:g}: {v}" for gd, v in zip(g.guidance, g.quality_verdict))
        elif (g.status != "ok").any():
            bad = g[g.status != "ok"].iloc[0]
            row.update(status=bad.status, note=bad.note, quality_verdict=None)
        out.append(row)
    return pd.DataFrame(out)


def trust(table: pd.DataFrame, plan: Plan, convergence: pd.DataFrame | None = None) -> tuple[bool, list[str]]:
    """Whether every control read what it must and (given `convergence`) the reference converged, per guidance."""
    cs = controls.defaults(plan.doses)
    ok, bad = (True, []) if convergence is None else converged_at(convergence, plan.guidances)
    for g in plan.guidances:
        at = table[table.guidance == g] if len(table) else table
        verdicts = dict(zip(at.key, at.get("quality_verdict", pd.Series(dtype=object))))
        good, why = controls.trusted(verdicts, cs)
        ok &= good
        bad += [f"guidance {g:g}: {w}" for w in why]
    return ok, bad


def for_study(study, keys: list[str], plan: Plan, *, folder: Path | None = None,
              say: Callable[[str], None] = print) -> pd.DataFrame:
    """The per-key quality table of `keys` (per guidance, trust and convergence in attrs): rows of this machine and
    commit read back, what they lack measured (with the controls and the seeds' sampler) and recorded."""
    from sdperf.optimizations.catalog import Stack
    from sdperf.core.paths import scratch_dir
    from sdperf.refmodel import storage

    for k in keys:  # unknown keys fail before anything is read or loaded
        Stack.of(k)
    wanted = [c.key for c in controls.defaults(plan.doses)] + [SEEDS_SAMPLER] + [k for k in keys if k != SEEDS_SAMPLER]

    def judged(wanted: list[str]) -> pd.DataFrame:
        have = _matching(from_rows(study.recorder.current()), plan)
        missing = [k for k in wanted if have.empty or have[have.key == k].guidance.nunique() < len(plan.guidances)]
        if missing:
            say(f"judging {len(missing)} key(s) against the converged solve: {', '.join(missing)}")
            table = measure(missing, study.profile, plan=plan, folder=folder or storage.default_dir(),
                            scratch=scratch_dir(study.profile.name) / "reference-techniques", say=say)
            record(study, table)
            have = _matching(from_rows(study.recorder.current()), plan)
        return have[have.key.isin(wanted + [k for k in have.key if str(k).startswith(REFERENCE)])]

    per_guidance = judged(wanted)
    out = overall(per_guidance, plan.guidances)
    every = fallbacks(out)
    instead = {k: alts[:plan.fallbacks] for k, alts in every.items()}
    extra = [a for alts in instead.values() for a in alts if a not in wanted]
    left = [a for k, alts in every.items() for a in alts if a not in instead[k] and a not in wanted]
    if extra or left:
        judging = (f"judging what the field uses instead: {', '.join(extra)}" if extra
                   else "judging none of what the field uses instead")
        limit = f" (not {', '.join(left)}: the profile's reference_fallbacks is {plan.fallbacks})" if left else ""
        say(f"over the budget alone: {', '.join(instead)}; {judging}{limit}")
    if extra:
        wanted += list(dict.fromkeys(extra))
        per_guidance = judged(wanted)
        out = overall(per_guidance, plan.guidances)
    why = {a: f"judged because {k} alone is over the budget" for k, alts in instead.items() for a in alts}
    out["why_judged"] = out.key.map(why)
    order = {k: i for i, k in enumerate(wanted)}
    out = out.sort_values("key", key=lambda s: s.map(lambda k: order.get(k, -1))).reset_index(drop=True)
    current = study.recorder.current()
    convergence = convergence_from_rows(current)
    out.attrs.update(per_guidance=per_guidance, trusted=trust(per_guidance, plan, convergence),
                     convergence=convergence, former=former_from_rows(current))
    return out


def fallbacks(table: pd.DataFrame) -> dict[str, list[str]]:
    """{technique key over the budget alone: what the field uses instead (its catalog `fallbacks`)}."""
    from sdperf.optimizations.catalog import Stack

    out = {}
    if table.empty or "quality_verdict" not in table:
        return out
    for key, verdict in zip(table.key, table.quality_verdict):
        if verdict != OVER or controls.is_control(key) or str(key).startswith(REFERENCE):
            continue
        parts = Stack.of(key).techniques
        if len(parts) == 1 and parts[0].fallbacks:  # a stack over the budget says nothing of one part alone
            out[key] = list(parts[0].fallbacks)
    return out


def _matching(table: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    if table.empty:
        return table
    return table[table.guidance.isin(plan.guidances)]


def budget_text() -> str:
    return paired.budget_text()
