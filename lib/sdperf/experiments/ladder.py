"""10_ladder: the optimizations stacked one on another, in the seed's order and in the order that is best here.

Stand-alone speed-ups do not multiply (two techniques attacking one overhead share one gain; an executor replacing
the UNet makes every UNet-level trick before it moot), so every rung is the whole stack up to it, run in processes
of its own, and all rungs of both ladders are ONE run_variants call: same rounds, same interpolated fp32 baseline.
A rung's gain over the rung below is the ratio of the two rungs' speed-ups per round, median [min-max], with a
verdict against the run's noise band.

Rules (stated in the notebook too):
- A rung that cannot run here is recorded as not applicable, a half precision whose generations would overrun
  `variant_budget_s` (timed on one UNet block first) as skipped; neither is stacked, the next rung builds on the last.
- A technique of a family already in the stack replaces it (Cerebrium's inference_mode replaces no_grad).
- The best order comes from notebooks 01-09's stand-alone rows (sdperf.select.standalone): techniques "faster" than
  fp32 eager alone that keep the picture (unless lossy rungs are allowed; sdperf.judge.techniques holds the budget),
  one per family, at most one UNet executor, stacked last because it compiles or exports what the rungs below set
  up; the others fastest first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sdperf.config import published
from sdperf.measure import half_budget, rounds
from sdperf.store import plots
from sdperf.measure.comparison import BASELINE, Comparison, published_row, run_variants
from sdperf.core.errors import ConfigError
from sdperf.experiments.common import interpolated, ratio_columns, rounds_method, rounds_n
from sdperf.optimizations import catalog
from sdperf.optimizations.catalog import Context, Stack
from sdperf.select import scenarios
from sdperf.select.standalone import keeps_picture, standalone
from sdperf.measure.study import Study

CEREBRIUM, BEST = scenarios.CEREBRIUM_LADDER, scenarios.BEST_LADDER
CEREBRIUM_ORDER = ("grad:no_grad", "precision:float16", "grad:inference_mode", "deepspeed:inject", "cuda_graphs")
METHOD_CHECK = "calibration:unet-twice"  # known answer: 0.5x per UNet step
CHECK_NAME = "check of the method: UNet twice"
NOT_CANDIDATES = (catalog.CALIBRATION,)  # a check of the method is never a rung of a recipe


@dataclass
class Rung:
    """One planned rung: the technique added, the stack it makes, and (if it does not run) why not."""

    ladder: str
    rung: int
    key: str
    stack: str
    name: str  # the configuration's display name in the run
    below: str  # display name of the stacked rung below (the baseline for the first)
    status: str = "ok"  # ok (to measure) / not_applicable / skipped
    note: str = ""


@dataclass
class Ladder:
    name: str
    rungs: list[Rung]
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


# ---------------------------------------------------------------- planning the stacks
def check_keys(keys) -> None:
    for k in keys:
        catalog.get(k)  # an unknown key is a ConfigError naming the valid ones


def stacked(stack: tuple[str, ...], key: str) -> tuple[tuple[str, ...], str]:
    """`stack` with `key` on top; a technique of the same family already there is replaced (and said so)."""
    fam = catalog.get(key).family
    gone = [k for k in stack if catalog.get(k).family == fam]
    new = tuple(k for k in stack if k not in gone) + (key,)
    return new, (f"replaces {', '.join(gone)} (same family: {fam})" if gone else "")


def plan(study: Study, name: str, keys, skips: dict[str, str] | None = None) -> Ladder:
    """The cumulative stacks of one ladder, planned without running anything (the module's first rule)."""
    check_keys(keys)
    ctx, skips = Context(study.profile), skips or {}
    stack: tuple[str, ...] = ()
    below, out = BASELINE, []
    for i, key in enumerate(keys, start=1):
        tech = catalog.get(key)
        new, note = stacked(stack, key)
        rung = Rung(name, i, key, catalog.join(new), scenarios.rung(name, i, tech.label), below, note=note)
        ok, reason = tech.availability(ctx)
        if not ok:
            rung.status, rung.note = "not_applicable", f"not applicable: {reason}"
        elif key in skips:
            rung.status, rung.note = "skipped", f"skipped: {skips[key]}"
        else:
            stack, below = new, rung.name
        out.append(rung)
    return Ladder(name, out)


# ---------------------------------------------------------------- choosing the best order
# Candidates are chosen and ranked per image at the seeds' 50 PLMS steps, the unit of every headline: at the profile's
# few timed steps the text encoder and VAE weigh far more, and a rung chosen there can be slower than the one below.
RANK = "seed_speedup"


def best_order(alone: pd.DataFrame, allow_lossy: bool = False) -> tuple[list[str], pd.DataFrame]:
    """The best order by the module's rule (and _stackable's): the keys and every technique's reason."""
    t = alone.copy()
    faster = (t.status == "ok") & (t[f"{RANK}_verdict"] == rounds.FASTER) & ~t.family.isin(NOT_CANDIDATES)
    keeps = t.apply(keeps_picture, axis=1) | allow_lossy
    cand = t[faster & keeps].sort_values(RANK, ascending=False).drop_duplicates("family")
    cand, apart = _stackable(cand)
    chosen = pd.concat([cand[cand.family != catalog.EXECUTOR], cand[cand.family == catalog.EXECUTOR]])
    t["candidate"] = t.key.isin(chosen.key)
    t["why"] = [apart.get(r.key) or _why(r, allow_lossy, chosen, cand) for _, r in t.iterrows()]
    return chosen.key.tolist(), t


def _stackable(cand: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """The candidates less those that cannot stack (catalog.Stack.of's rule): of the executor and the techniques that
    patch the UNet's blocks, the side with the larger speed-up alone stays. Returns the rest and each drop's reason."""
    traced, patched = catalog.trace_conflict([catalog.get(k) for k in cand.key])
    executor, patching = cand[cand.key.isin(traced)], cand[cand.key.isin(patched)]
    if executor.empty or patching.empty:
        return cand, {}
    e = executor.iloc[0]
    keep_engine = e[RANK] >= patching[RANK].max()
    drop, kept = (patching, executor) if keep_engine else (executor, patching)
    why = (f"cannot stack with {', '.join(kept.key)}: an engine runs a trace of the UNet, and feature caching or "
           f"token merging patches its blocks in Python; the larger speed-up alone was kept "
           f"({e.key} {e[RANK]:.3f}x against {patching[RANK].max():.3f}x per image at 50 steps)")
    return cand[~cand.key.isin(drop.key)], {k: why for k in drop.key}


def _why(r, allow_lossy: bool, chosen: pd.DataFrame, cand: pd.DataFrame) -> str:
    if r.status != "ok":
        return f"{r.status} in {r.notebook}"
    if r.family in NOT_CANDIDATES:
        return "a check of the method, not an optimization"
    if r[f"{RANK}_verdict"] != rounds.FASTER:
        return (f"not faster than fp32 alone per image at 50 steps: {r[RANK]:.3f}x [{r[f'{RANK}_lo']:.3f}-"
                f"{r[f'{RANK}_hi']:.3f}], {r[f'{RANK}_verdict']}")
    if not allow_lossy and not keeps_picture(r):
        return f"changes the picture: {quality_text(r)}"
    if r.key not in set(chosen.key):
        return f"a faster technique of its family ({r.family}) was chosen: one per family"
    return "candidate" + (" (the UNet executor, stacked last)" if r.family == catalog.EXECUTOR else "")


def quality_text(r) -> str:
    """What the reference model measured for a lossy technique, or why nothing was measured."""
    if pd.isna(r.get("adherence_delta")):
        v = r.get("quality_verdict")
        return "no quality measurement on the reference model" if v is None or pd.isna(v) else str(v)
    return (f"{r['quality_verdict']} on the reference model against the converged fp32 solve (adherence "
            f"{r['adherence_delta']:+.3f} [{r['adherence_delta_lo']:+.3f}, {r['adherence_delta_hi']:+.3f}], domain FID "
            f"{r['fid_delta']:+.2f} [{r['fid_delta_lo']:+.2f}, {r['fid_delta_hi']:+.2f}])")


QUALITY_COLUMNS = ("quality_verdict", "adherence_delta", "adherence_delta_lo", "adherence_delta_hi", "fid_delta",
                   "fid_delta_lo", "fid_delta_hi", "psnr_db_median")


def with_quality(study: Study, alone: pd.DataFrame, say: Callable[[str], None] = print) -> pd.DataFrame:
    """The stand-alone table with the reference-model quality of its lossy techniques that are faster alone."""
    from sdperf.quality.quality_settings import settings
    from sdperf.judge import techniques

    t = alone.copy()
    lossy = t[(t.status == "ok") & (t.speedup_verdict == rounds.FASTER) & t.changes_output.astype(bool)
              & ~t.family.isin(NOT_CANDIDATES)].key.tolist()
    for col in QUALITY_COLUMNS:
        t[col] = None
    if not lossy:
        return t
    s = settings(study.profile)
    try:
        q = techniques.for_study(study, lossy, techniques.Plan.of(s), say=say)
    except ConfigError as exc:  # no verified reference model: nothing lossy can be shown to keep the picture
        say(f"no quality measurement: {exc}")
        t.loc[t.key.isin(lossy), "quality_verdict"] = f"not measured: {exc}"
        return t
    by_key = q.set_index("key") if len(q) else pd.DataFrame()
    for i, key in t.key.items():
        if key in by_key.index:
            got = by_key.loc[key]
            if got.status != "ok":
                t.at[i, "quality_verdict"] = f"not measured on the reference model: {got.note}"
                continue
            for col in QUALITY_COLUMNS:
                t.at[i, col] = got[col]
    return t


# ---------------------------------------------------------------- measuring and reading the ladders
def rung_items(ladders: list[Ladder], check: bool = True) -> list[tuple[str, str]]:
    """(name, stack) of every rung that runs, of every ladder, and the check of the method."""
    items = [(r.name, r.stack) for lad in ladders for r in lad.rungs if r.status == "ok"]
    return items + ([(CHECK_NAME, METHOD_CHECK)] if check else [])


def measure(study: Study, ladders: list[Ladder], *, check: bool = True,
            say: Callable[[str], None] = print) -> Comparison:
    """Every rung that runs in one run_variants call, the others recorded with their reason; fills the tables."""
    cmp = run_variants(study, rung_items(ladders, check), say=say)
    rows = []
    for lad in ladders:
        for r in lad.rungs:
            if r.status != "ok":
                rows.append(dict(scenario=r.name + ", batch 1", metric="latency", value=None, unit="",
                                 status=r.status, note=r.note, method=cmp.method, key=r.stack, batch_size=1))
        lad.table = ladder_table(cmp, lad)
        for row in lad.table[(lad.table.rung > 0) & lad.table.vs_rung_below.notna()].itertuples():
            rows.append(dict(scenario=row.name + ", batch 1", metric="speedup_vs_rung_below",
                             value=row.vs_rung_below, unit="x", lo=row.vs_lo, hi=row.vs_hi, n=int(row.rounds),
                             method=cmp.method, key=row.stack, batch_size=1, verdict=row.vs_verdict,
                             note=f"vs {row.below}: per round, this rung's speed-up over fp32 / the rung below's; "
                                  f"{row.vs_verdict} (noise band {cmp.noise['speedup'][0]:.3f}-"
                                  f"{cmp.noise['speedup'][1]:.3f}x)"))
    study.recorder.add_many(rows)
    return cmp


def over_rung_below(ratios: pd.DataFrame, name: str, below: str) -> pd.Series:
    """Per round: this rung's per-image speed-up over fp32 eager divided by the rung below's (the baseline's is 1)."""
    mine = ratios[ratios.config == name].set_index("round")["speedup"]
    if below == BASELINE:
        return mine
    under = ratios[ratios.config == below].set_index("round")["speedup"]
    return (mine / under).dropna()


def ladder_table(cmp: Comparison, lad: Ladder) -> pd.DataFrame:
    """One row per rung (rung 0: fp32 eager): speed-ups over fp32 eager and over the rung below, drift, or why not."""
    base = cmp.row(BASELINE) or {}
    rows = [{"ladder": lad.name, "rung": 0, "key": "", "technique": BASELINE, "stack": catalog.BASELINE_KEY,
             "name": BASELINE, "below": "", "status": "ok", "rounds": base.get("rounds"),
             "speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0, "vs_rung_below": 1.0, "vs_lo": 1.0, "vs_hi": 1.0,
             "s_per_image": base.get("s_per_image"), "method": cmp.method, "note": "the reference"}]
    band = cmp.noise["speedup"]
    for r in lad.rungs:
        row = {"ladder": lad.name, "rung": r.rung, "key": r.key, "technique": catalog.get(r.key).label,
               "stack": r.stack, "name": r.name, "below": r.below, "status": r.status, "note": r.note}
        got = cmp.row(r.name) if r.status == "ok" else None
        if got is not None:
            row.update({k: got.get(k) for k in TABLE_NUMBERS}, status=got["status"], method=cmp.method)
            if got["status"] == "ok":
                vs = over_rung_below(cmp.measured.ratios, r.name, r.below)
                if len(vs):
                    row.update(vs_rung_below=vs.median(), vs_lo=vs.min(), vs_hi=vs.max(),
                               vs_verdict=rounds.speed_verdict(vs.min(), vs.max(), band))
                row["note"] = "; ".join(x for x in (r.note, got.get("verdict")) if isinstance(x, str) and x)
            else:
                row["note"] = got.get("note") or r.note
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=TABLE_COLUMNS)


TABLE_NUMBERS = ("rounds", "s_per_image", *ratio_columns("speedup", "unet_step_speedup", "seed_speedup"),
                 "peak_memory_mib", "latent_rel_error", "image_psnr_db")
TABLE_COLUMNS = ["ladder", "rung", "key", "technique", "stack", "name", "below", "status", *TABLE_NUMBERS[:6],
                 "vs_rung_below", "vs_lo", "vs_hi", "vs_verdict", *TABLE_NUMBERS[6:], "method", "note"]


def decide(study: Study, *, allow_lossy: bool = False, say: Callable[[str], None] = print) -> dict:
    """Choose the best order from the stand-alone rows and plan both ladders; nothing is measured yet."""
    alone = with_quality(study, standalone(study), say=say)
    order, choice = best_order(alone, allow_lossy=allow_lossy)
    skips = half_budget.skips(study, list(CEREBRIUM_ORDER) + order, say=say)
    cerebrium = plan(study, CEREBRIUM, CEREBRIUM_ORDER, skips)
    best = plan(study, BEST, order, skips)
    return {"cerebrium": cerebrium, "best": best, "choice": choice, "order": order}


def run(study: Study, *, allow_lossy: bool = False, check: bool = True, say: Callable[[str], None] = print) -> dict:
    """Choose the best order, plan both ladders, measure them in one run."""
    decided = decide(study, allow_lossy=allow_lossy, say=say)
    return measure_with(study, decided, {}, check=check, say=say)


def measure_with(study: Study, decided: dict, others: dict[str, str], *, check: bool = True,
                 say: Callable[[str], None] = print) -> dict:
    """Both ladders of `decided` and `others` ({name: stack}: the stack search's chosen stacks) in ONE schedule of
    rounds, so one set of fp32 baselines serves all. The ladders' rows are recorded here, `others`' by their owner."""
    ladders = [decided["cerebrium"], decided["best"]]
    if others:
        items = rung_items(ladders, check)
        clash = sorted({name for name, _ in items} & set(others))
        if clash:
            raise ValueError(f"names measured by both the ladders and the search: {', '.join(clash)}")
        run_variants(study, items + list(others.items()), say=say, store=False)
    cmp = measure(study, ladders, check=check, say=say)  # with `others`: every rung is read back
    return {**decided, "comparison": cmp}


# ---------------------------------------------------------------- presenting
def show_table(ladders: list[Ladder]) -> pd.DataFrame:
    """The numbers the figure draws, and every rung's reason."""
    cols = ["ladder", "rung", "technique", "stack", "status", "speedup", "speedup_lo", "speedup_hi",
            "speedup_verdict", "vs_rung_below", "vs_lo", "vs_hi", "vs_verdict", "unet_step_speedup",
            "seed_speedup", "latent_rel_error", "image_psnr_db", "note"]
    return pd.concat([lad.table for lad in ladders], ignore_index=True).reindex(columns=cols)


def plot(study: Study, ladders: list[Ladder], cmp: Comparison):
    """Per ladder: the speed-up over fp32 eager and over the rung below (min-max over rounds), and the noise band."""
    fig, axes = plt.subplots(len(ladders), 2, figsize=(12, 3.4 * len(ladders)), squeeze=False)
    lo, hi = cmp.noise["speedup"]
    colors = {rounds.FASTER: "tab:green", rounds.SLOWER: "tab:red", rounds.NOISE: "tab:gray"}
    for (ax_f, ax_b), lad in zip(axes, ladders):
        t = lad.table[(lad.table.status == "ok") & (lad.table.rung > 0)]
        labels = [f"{r.rung}: {r.key}" for r in t.itertuples()]
        for ax, col, l, h, v, what in ((ax_f, "speedup", "speedup_lo", "speedup_hi", "speedup_verdict",
                                        "over fp32 eager"),
                                       (ax_b, "vs_rung_below", "vs_lo", "vs_hi", "vs_verdict", "over the rung below")):
            y = t[col].astype(float).to_numpy()
            err = np.vstack([y - t[l].astype(float), t[h].astype(float) - y]) if len(t) else None
            ax.bar(labels, y, yerr=err, capsize=4, color=[colors.get(x, "tab:gray") for x in t[v]])
            ax.axhspan(lo, hi, color="grey", alpha=0.2, label="noise band (fp32 vs fp32)")
            ax.axhline(1.0, color="black", lw=0.8)
            scale = plots.ratio_scale(ax, [1.0, lo, hi, *y, *t[l].astype(float), *t[h].astype(float)])
            ax.set(ylabel="x (median, min-max over rounds" + (", log)" if scale == "log" else ")"),
                   title=f"{lad.name}: per image, {what}")
            ax.tick_params(axis="x", labelrotation=25, labelsize=8)
            if not len(t):
                ax.text(0.5, 0.5, "no rung ran", transform=ax.transAxes, ha="center")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(cmp.method, fontsize=9)
    drawn = pd.concat([lad.table[lad.table.rung > 0] for lad in ladders], ignore_index=True)
    study.save_figure(fig, "ladder",
                      what=f"The ladders ({', '.join(lad.name for lad in ladders)}), rung by rung: each rung the whole "
                      "stack up to it, speed-up per image at the profile's steps over fp32 eager (left) and over the "
                      "rung below (right), coloured by verdict against the noise band (green faster, red slower, "
                      "grey within noise; band shaded)",
                      baseline=interpolated(BASELINE) + "; right: the rung below in the same round (ratio of the "
                      "two rungs' ratios)", method=rounds_method(cmp), n=rounds_n(study, drawn))
    return fig


def method_check(cmp: Comparison) -> pd.DataFrame:
    """The calibration configuration beside its known answer (0.5x per UNet step)."""
    r = cmp.row(CHECK_NAME)
    if r is None:
        return pd.DataFrame()
    return pd.DataFrame([{"check": CHECK_NAME, "expected_unet_step_speedup": 0.5, "status": r["status"],
                          "unet_step_speedup": r.get("unet_step_speedup"), "lo": r.get("unet_step_speedup_lo"),
                          "hi": r.get("unet_step_speedup_hi"), "method": cmp.method}])


def best_recipe(ladder: Ladder) -> dict:
    """The rung of the best-order ladder with the highest per-image speed-up among those "faster" than fp32."""
    t = ladder.table
    ok = t[(t.rung > 0) & (t.status == "ok") & (t.speedup_verdict == rounds.FASTER)]
    if ok.empty:
        return {"recipe": "fp32 eager (nothing beat it)", "key": catalog.BASELINE_KEY, "per_image_speedup": None,
                "per_image_lo": None, "per_image_hi": None, "verdict": None, "per_unet_step_speedup": None,
                "seed_speedup": None, "image_psnr_db": None, "method": t.method.iloc[0] if len(t) else ""}
    top = ok.loc[ok.speedup.astype(float).idxmax()]
    return {"recipe": Stack.of(top.stack).label, "key": top.stack, "per_image_speedup": top.speedup,
            "per_image_lo": top.speedup_lo, "per_image_hi": top.speedup_hi, "verdict": top.speedup_verdict,
            "per_unet_step_speedup": top.unet_step_speedup, "seed_speedup": top.seed_speedup,
            "image_psnr_db": top.image_psnr_db, "method": top.method}


def record_best(study: Study, best: dict) -> None:
    """The headline: the best recipe's speed-ups over fp32 eager, per image and per UNet step."""
    if best["per_image_speedup"] is None:
        return
    scenario = scenarios.named(scenarios.BEST_RECIPE, best["recipe"])
    common = dict(unit="x", method=best["method"], key=best["key"], batch_size=1)
    study.recorder.add_many([
        dict(scenario=scenario, metric="speedup_vs_fp32", value=best["per_image_speedup"], lo=best["per_image_lo"],
             hi=best["per_image_hi"], verdict=best["verdict"],
             note=f"per image (whole generation, batch 1); {best['verdict']}", **common),
        dict(scenario=scenario, metric="unet_step_speedup_vs_fp32", value=best["per_unet_step_speedup"],
             note="per UNet step (median UNet call)", **common)])


def _rung(ladder: Ladder, key: str) -> pd.Series | None:
    t = ladder.table
    row = t[t.key == key] if len(t) else t
    return row.iloc[0] if len(row) else None


def _measured(ladder: Ladder, key: str, column: str = "vs_rung_below") -> tuple[float | None, str]:
    """(the rung's figure, or None, and why not: the rung's own reason when it did not run)."""
    r = _rung(ladder, key)
    if r is None:
        return None, f"not measured here: {key} is not a rung of the {ladder.name} ladder"
    if r.status != "ok" or pd.isna(r[column]):
        return None, f"not measured here: {r.status}: {r.note}"
    return float(r[column]), ""


def published_vs_measured(study: Study, cerebrium: Ladder, best: Ladder) -> pd.DataFrame:
    """Every speed claim of the seeds beside the ratio measured here, like with like: a rung over the rung below
    beside a published rung, the whole ladder only beside a stack whose every rung ran, per UNet step beside it/s."""
    rung = study.conditions(scope="per image at the profile's steps, this Cerebrium-order rung over the rung below")
    stack = study.conditions(scope="per image at 50 PLMS steps composed from the measured stages, the "
                                   "Cerebrium-order stack over fp32 eager")
    lad = published.select("Cerebrium SD ladder", metric="latency").set_index("what")["value"]
    nemo = published.select("NeMo SD inference", model="SD 1.x", batch_size=1, metric="latency")
    nemo = nemo.set_index("what")["value"]
    paiton = published.select("Paiton SDXL", metric="it_per_s").set_index("what")["value"]
    cer, nv, amd = (published.cite(s) for s in ("Cerebrium SD ladder", "NeMo SD inference", "Paiton SDXL"))
    recipe = best_recipe(best)
    rows = []
    for claim, key, before, after in (("fp32 -> fp16", "precision:float16", "fp32", "fp16"),
                                      ("+ inference_mode", "grad:inference_mode", "fp16", "inference_mode"),
                                      ("+ DeepSpeed inference", "deepspeed:inject", "inference_mode", "deepspeed")):
        got, why = _measured(cerebrium, key)
        rows.append(published_row(claim, cer, "NVIDIA A10G", "SD v1.x 512px", lad[before] / lad[after], got,
                                  why or rung, detail=f"{lad[before]} -> {lad[after]} s"))
    got, why = _measured(cerebrium, "grad:inference_mode", "seed_speedup")
    rows.append(published_row("fp32 -> fp16 -> inference_mode (the rungs before DeepSpeed)", cer, "NVIDIA A10G",
                              "SD v1.x 512px", lad["fp32"] / lad["inference_mode"], got, why or stack,
                              detail=f"{lad['fp32']} -> {lad['inference_mode']} s"))
    got, why = _measured(cerebrium, "deepspeed:inject", "seed_speedup")
    rows.append(published_row("the whole ladder (fp32 -> DeepSpeed)", cer, "NVIDIA A10G", "SD v1.x 512px",
                              lad["fp32"] / lad["deepspeed"], got,
                              (f"{why}; a stack without its DeepSpeed rung is not the whole ladder (the rungs that "
                               "ran are the row above)") if why else stack,
                              detail=f"{lad['fp32']} -> {lad['deepspeed']} s"))
    rows.append(published_row(
        "framework -> TensorRT, batch 1", nv, "NVIDIA A100 80GB", "SD 1.x 512px, 50 PLMS",
        nemo["framework fp16 AMP"] / nemo["TensorRT fp16"], recipe["seed_speedup"],
        study.conditions(scope="per image at 50 PLMS steps composed from the measured stages")
        + f"; the best recipe here ({recipe['recipe']}), not an engine alone: 07 sets engines beside this figure",
        detail=f"{nemo['framework fp16 AMP']} -> {nemo['TensorRT fp16']} s"))
    rows.append(published_row(
        "PyTorch + diffusers -> custom kernels (it/s)", amd, "AMD MI300X", "SDXL 1024px, 20 steps",
        paiton["Paiton custom kernels fp16"] / paiton["PyTorch + diffusers fp16"], recipe["per_unet_step_speedup"],
        study.conditions(scope="per UNet step, the unit of it/s (denoising steps per second), not per image")
        + f"; the best recipe here ({recipe['recipe']})",
        detail=f"~{paiton['PyTorch + diffusers fp16']:g} -> ~{paiton['Paiton custom kernels fp16']:g} it/s"))
    out = pd.DataFrame(rows)
    out["method"] = best.table.method.iloc[0] if len(best.table) else ""
    return out


# ---------------------------------------------------------------- the allocator
ALLOCATOR_COLUMNS = ["variant", "key", "status", "s_per_image",
                     *ratio_columns("speedup", "seed_speedup", "unet_step_speedup"), "peak_memory_mib",
                     "latent_rel_error", "method", "note"]


def allocator_rung(study: Study, keys: list[str], say: Callable[[str], None] = print) -> pd.DataFrame:
    """fp32 eager under each allocator, every process launched from a fork server started under its setting (an
    allocator is set before a process starts). No keys: an empty table, not a baseline-and-twin round of its own."""
    bad = [k for k in keys if catalog.get(k).family != catalog.ALLOCATOR]
    if bad:
        raise ConfigError(f"not allocator settings: {', '.join(bad)}; valid: "
                          f"{', '.join(catalog.keys(family=catalog.ALLOCATOR))}")
    if not keys:
        return pd.DataFrame(columns=ALLOCATOR_COLUMNS)
    cmp = run_variants(study, list(keys), say=say)
    return cmp.table.reindex(columns=ALLOCATOR_COLUMNS)
