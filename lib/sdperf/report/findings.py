"""One verdict per notebook, written from its rows in results.csv: a reader's first screen, with no typed number.

Each sentence names its number, range, baseline, method and noise verdict as the rows record them; rows not measured
are counted with their first reason, so a notebook whose rungs do not apply here does not read as a success.
"""
from __future__ import annotations

import html
from typing import Callable

import pandas as pd

from sdperf.report.numbers import fixed, value_range
from sdperf.select import scenarios

TWIN = "fp32-eager"  # the fp32 twin: the noise floor's row, not a configuration to rank


class Legend:
    """Methods cited by short labels, each full text once in the legend under the findings (keeps them short)."""

    def __init__(self):
        self.texts: list[str] = []

    def cite(self, method) -> str:
        text = str(method)
        if text not in self.texts:
            self.texts.append(text)
        return f"[M{self.texts.index(text) + 1}]"

    def html(self) -> str:
        return "".join(f"<li>[M{i}] {_esc(t)}</li>" for i, t in enumerate(self.texts, 1))

NOT_MEASURED = ("not_applicable", "skipped", "failed")
SPEED_VERDICTS = ("faster", "slower", "within noise")


def _esc(text) -> str:
    return html.escape(str(text), quote=False)


def _range(row, digits: int = 2, unit: str = "x") -> str:
    return value_range(row["value"], row.get("lo"), row.get("hi"), digits, unit)


def _not_measured(rows: pd.DataFrame) -> str:
    """'; 2 not applicable, 1 failed': what the notebook could not measure (the reasons are in its table)."""
    parts = [f"{n} {status.replace('_', ' ')}" for status in NOT_MEASURED
             if (n := int((rows["status"] == status).sum()))]
    return "; " + ", ".join(parts) if parts else ""


def _method(legend: Legend | None, method) -> str:
    return legend.cite(method) if legend is not None else f"(method: {_esc(method)})"


def speed_verdict(rows: pd.DataFrame, legend: Legend | None = None) -> str | None:
    """The fastest configuration per image at 50 PLMS steps over fp32 eager, and how the others fall against noise."""
    ok = rows[(rows["status"] == "ok") & (rows["metric"] == "seed_speedup_vs_fp32") & (rows["key"] != TWIN)
              & rows["value"].notna()]
    if ok.empty:
        return None
    best = ok.loc[ok["value"].astype(float).idxmax()]
    bands = ok["verdict"].where(ok["verdict"].isin(SPEED_VERDICTS)).fillna("no band").value_counts()
    counts = ", ".join(f"{n} {w}" for w, n in bands.items())
    word = best.get("verdict") if best.get("verdict") in SPEED_VERDICTS else None
    return (f"fastest of {len(ok)}: <b>{_esc(best['scenario'].removesuffix(', batch 1'))}</b> "
            f"{_range(best)} per image over fp32 eager PLMS-50{', ' + word if word else ''} "
            f"{_method(legend, best['method'])}; all {len(ok)}: {_esc(counts)}")


def baseline_verdict(rows: pd.DataFrame, legend: Legend | None = None) -> str | None:
    one = rows[(rows["scenario"] == "fp32 eager, batch 1") & (rows["status"] == "ok")].set_index("metric")
    if "s_per_image" not in one.index:
        return None
    s = one.loc["s_per_image"]
    text = f"fp32 eager takes {_range(s, 2, ' s')} per image at batch 1 {_method(legend, s['method'])}"
    if "unet_step" in one.index:
        text += f", {_range(one.loc['unet_step'], 3, ' s')} per UNet step"
    if "percent_of_peak" in one.index:
        text += f", {fixed(one.loc['percent_of_peak']['value'], 0)}% {_esc(one.loc['percent_of_peak']['note'])}"
    return text


def quality_verdict(rows: pd.DataFrame, legend: Legend | None = None) -> str | None:
    """The reference model's verdicts against the converged solve, recomputed from the rows' interval columns."""
    from sdperf.optimizations import catalog
    from sdperf.judge import controls, techniques

    table = techniques.from_rows(rows[rows["status"].isin(["ok", "failed", "not_applicable"])])
    if table.empty or "quality_verdict" not in table:
        return _before_the_converged_reference(rows)
    per_key = techniques.overall(table[table.status == "ok"], tuple(dict.fromkeys(table.guidance)))
    ctrl = per_key[per_key.key.map(controls.is_control)]
    judged = per_key[per_key.key.map(lambda k: not controls.is_control(k) and not str(k).startswith(
        techniques.REFERENCE) and k != techniques.SEEDS_SAMPLER and len(catalog.split(str(k))) == 1)]  # stacks: 10's
    text = ""
    seeds = per_key[per_key.key == techniques.SEEDS_SAMPLER]
    if len(seeds):
        r = seeds.iloc[0]
        text += (f"fp32 PLMS-50, the seeds' sampler, is {_esc(r.quality_verdict)} against the converged solve "
                 f"(adherence {value_range(r.adherence_delta, r.adherence_delta_lo, r.adherence_delta_hi, 3, '')}, "
                 f"n={int(r.n_images)}); ")
    if len(ctrl):
        fails = [f"{k} {v}" for k, v in zip(ctrl.key, ctrl.quality_verdict) if v != controls.expected(k)]
        text += ("controls as required (twin within, harms over); " if not fails else
                 f"<b>controls failed ({_esc('; '.join(fails))}): the budget cannot be trusted</b>; ")
    counts = judged.quality_verdict.fillna("unjudged").value_counts()
    text += (f"{len(judged)} techniques alone: " + ", ".join(f"{n} {_esc(v)}" for v, n in counts.items()))
    over = judged[judged.quality_verdict == techniques.OVER]
    if len(over):
        worst = over.loc[over.adherence_delta.astype(float).idxmin()]
        text += (f"; worst alone: <b>{_esc(worst.key)}</b> "
                 f"{value_range(worst.adherence_delta, worst.adherence_delta_lo, worst.adherence_delta_hi, 3, '')}")
    return text


def _before_the_converged_reference(rows: pd.DataFrame) -> str | None:
    """Rows judged against fp32 PLMS-50 (their verdict only in the note): counted as written, against that reference."""
    deltas = rows[(rows["metric"] == "reference_adherence_delta") & (rows["status"] == "ok") & (rows["key"] != TWIN)]
    if deltas.empty:
        return None
    verdict = deltas["note"].astype(str).str.extract(r"^(within budget|over budget|undecided)")[0].fillna("unjudged")
    counts = verdict.value_counts()
    return (f"on the trained reference model, {len(deltas)} techniques paired image by image against fp32 PLMS-50 "
            "(the reference before the converged solve): " + ", ".join(f"{n} {_esc(v)}" for v, n in counts.items()))


def scaling_verdict(rows: pd.DataFrame, legend: Legend | None = None) -> str | None:
    eff = rows[(rows["metric"] == "scaling_efficiency") & (rows["status"] == "ok")]
    if eff.empty:
        return None
    items = [f"{_esc(r['scenario'])}: {fixed(r['value'])}" for _, r in eff.iterrows()]
    return "scaling efficiency (1.0 = linear) " + "; ".join(items)


def serving_verdict(rows: pd.DataFrame, legend: Legend | None = None) -> str | None:
    tput = rows[(rows["metric"] == "throughput") & (rows["status"] == "ok") & rows["value"].notna()]
    if tput.empty:
        return None
    best = tput.loc[tput["value"].astype(float).idxmax()]
    return (f"highest throughput <b>{_esc(best['scenario'])}</b>, {fixed(best['value'], 3)} images/s "
            f"({_esc(str(best['note']).split(';')[0])}) over {len(tput)} LoadGen runs")


def ladder_verdict(rows: pd.DataFrame, legend: Legend | None = None) -> str | None:
    recipe = scenarios.of_kind(rows, *scenarios.HEADLINES)
    recipe = recipe[recipe["metric"] == "seed_speedup_vs_fp32"]
    if recipe.empty:
        return speed_verdict(rows, legend)
    items = [f"<b>{_esc(r['scenario'])}</b> {_range(r)} per image over fp32 eager PLMS-50 "
             f"{_method(legend, r['method'])}" for _, r in recipe.iterrows()]
    return "; ".join(items)


# notebook -> what its verdict is about; every other notebook gets the speed verdict when it has compared rows
SPECIFIC: dict[str, Callable[..., str | None]] = {
    "00_baseline": baseline_verdict, "10_ladder": ladder_verdict, "11_training_scaling": scaling_verdict,
    "12_fid_clip": quality_verdict, "13_serving": serving_verdict,
}


def verdict(name: str, rows: pd.DataFrame, legend: Legend | None = None) -> str:
    """The notebook's one-sentence finding (HTML), from its rows only; methods cited into `legend` when given."""
    text = (SPECIFIC.get(name) or speed_verdict)(rows, legend) if len(rows) else None
    if text is None:
        ok = int((rows["status"] == "ok").sum()) if len(rows) else 0
        text = f"{ok} measured row(s), none of them a comparison with fp32 eager" if ok else "nothing measured"
    return text + _not_measured(rows) + "."


QUALITY = "12_fid_clip"  # the notebook whose finding states the run's reference-model verdicts


def reference_detail(results: pd.DataFrame) -> str | None:
    """What every quality verdict is judged against: the converged reference and both legs of its convergence check."""
    from sdperf.judge import techniques

    text = techniques.convergence_sentence(results)
    return _esc(text) if text else None


# notebook -> a paragraph under its finding in its own section (not on the first screen), from the run's rows
DETAILS: dict[str, Callable[[pd.DataFrame], str | None]] = {QUALITY: reference_detail}


def detail(name: str, results: pd.DataFrame) -> str | None:
    got = DETAILS.get(name)
    return got(results) if got is not None and len(results) else None


def verdicts(results: pd.DataFrame, names: list[str], legend: Legend | None = None) -> dict[str, str]:
    return {name: verdict(name, rows_of(results, name), legend) for name in names}


def rows_of(results: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows a notebook's finding reads: its own; for QUALITY also the converged-solve judgments 10 recorded."""
    mine = results[results["notebook"] == name]
    if name != QUALITY or "scenario" not in results:
        return mine
    from sdperf.judge import techniques

    shared = results[(results["notebook"] != name)
                     & results["scenario"].astype(str).str.startswith(techniques.SCENARIO + ": ")]
    return pd.concat([mine, shared[~shared["scenario"].isin(set(mine["scenario"]))]], ignore_index=True)
