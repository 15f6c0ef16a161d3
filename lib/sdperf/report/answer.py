"""The study's answer as the README states it: a markdown table written from a report's rows, never typed.

`sdperf answer --profile cpu --readme README.md` rewrites the README's block between BEGIN and END from the committed
`reports/cpu/results.csv`: 10's headline stacks and the best-order ladder's rungs, each with its quality verdict.
"""
from __future__ import annotations

import re

import pandas as pd

from sdperf.report.numbers import value_range
from sdperf.select import scenarios

LADDER = "10_ladder"
BEGIN = "<!-- answer: begin; written by `sdperf answer --profile cpu --readme README.md` -->"
END = "<!-- answer: end -->"
PER_IMAGE, PER_STEP, ADHERENCE = "seed_speedup_vs_fp32", "unet_step_speedup_vs_fp32", "reference_adherence_delta"


class MissingBlock(ValueError):
    """The file has no BEGIN ... END block to rewrite."""


def lossless(key) -> bool:
    """A stack none of whose parts may change the picture (sdperf.optimizations.catalog)."""
    from sdperf.optimizations.catalog import Stack

    try:
        return isinstance(key, str) and bool(key) and not Stack.of(key).changes_output
    except Exception:  # a key this commit's catalog no longer knows: its own rows speak for it
        return False


def seeds_quality(results) -> dict | None:
    """fp32 PLMS-50's own judged rows at the seeds' guidance: a lossless stack's quality, or None if not judged."""
    from sdperf.judge import techniques

    t = techniques.from_rows(results)
    if t.empty:
        return None
    t = t[(t.key == techniques.SEEDS_SAMPLER) & (t.guidance == techniques.GUIDANCE) & (t.status == "ok")]
    if t.empty or "quality_verdict" not in t:
        return None
    r = t.iloc[-1]
    return {**{m: {"value": r[m], "lo": r[f"{m}_lo"], "hi": r[f"{m}_hi"]} for m in ("adherence_delta", "fid_delta")},
            "verdict": str(r["quality_verdict"]), "n": int(r["n_images"])}


def _metrics(rows: pd.DataFrame) -> dict:
    return {r.metric: r for r in rows.itertuples()}


def _ratio(m: dict, metric: str) -> str:
    r = m.get(metric)
    return "not measured" if r is None else value_range(r.value, r.lo, r.hi, 2, "x")


def _delta(r) -> str:
    return value_range(r.value, r.lo, r.hi, 3, "")


def _parts_quality(key: str, judged: pd.DataFrame) -> str:
    """Each lossy part's own verdict alone against the converged solve (worst over the judged guidances)."""
    from sdperf.optimizations.catalog import Stack

    words = []
    for tech in Stack.of(key).techniques:
        if not tech.changes_output:
            continue
        mine = judged[judged.key == tech.key] if not judged.empty else judged
        verdict = mine["quality_verdict"].iloc[0] if len(mine) and "quality_verdict" in mine else None
        words.append(f"{tech.key} alone: {verdict if isinstance(verdict, str) else 'not judged'}")
    return "; ".join(words) or "lossless"


def _headline_quality(key: str, m: dict, seeds: dict | None) -> str:
    if lossless(key):
        if seeds is None:
            return "lossless: fp32 PLMS-50's pictures (not judged)"
        a = seeds["adherence_delta"]
        return (f"lossless: fp32 PLMS-50's own pictures, adherence {value_range(a['value'], a['lo'], a['hi'], 3, '')} "
                f"({seeds['verdict']}, n={seeds['n']})")
    r = m.get(ADHERENCE)
    if r is None:
        return "not judged"
    verdict = next((w.strip() for w in str(r.note).split(";") if "budget" in w or "undecided" in w), "not judged")
    n = f", n={int(r.n)}" if pd.notna(r.n) else ""
    return f"the stack whole: adherence {_delta(r)} ({verdict}{n})"


def rows(results: pd.DataFrame) -> list[dict]:
    """The answer's rows, best admissible first: stack, speed-ups over fp32 eager PLMS-50 and quality verdict."""
    from sdperf.judge import techniques

    ladder = results[results["notebook"] == LADDER] if len(results) else results
    if ladder.empty:
        return []
    judged = techniques.overall(techniques.from_rows(results))
    seeds = seeds_quality(results)
    out = []
    for kind in scenarios.HEADLINES:
        mine = scenarios.of_kind(ladder, kind)
        if mine.empty:
            continue
        key = scenarios.subject(mine["scenario"].iloc[0], kind)
        m = _metrics(mine)
        out.append({"what": kind, "stack": key, "per image": _ratio(m, PER_IMAGE), "per UNet step": _ratio(m, PER_STEP),
                    "quality": _headline_quality(key, m, seeds)})
    rungs = ladder[ladder["scenario"].astype(str).str.startswith(f"{scenarios.BEST_LADDER} ")]
    for scenario, g in rungs.groupby("scenario", sort=False):
        ok = g[g["status"] == "ok"]
        if ok.empty:
            continue
        m = _metrics(ok)
        label = re.sub(r", batch \d+$", "", str(scenario))
        out.append({"what": f"ladder, {label}", "stack": str(ok["key"].iloc[0]), "per image": _ratio(m, PER_IMAGE),
                    "per UNet step": _ratio(m, PER_STEP), "quality": _parts_quality(str(ok["key"].iloc[0]), judged)})
    return out


def _where(results: pd.DataFrame) -> str:
    """Where the rows were taken: machine, commit, run, and the setting and batch of 10's headline rows."""
    r = results.sort_values("time_utc", kind="stable").iloc[-1]
    head = scenarios.of_kind(results[results["notebook"] == LADDER], *scenarios.HEADLINES)
    setting = head["setting"].dropna().iloc[0] if "setting" in head and head["setting"].notna().any() else r["profile"]
    batches = sorted({int(b) for b in head["batch_size"].dropna()}) if "batch_size" in head else []
    return (f"Measured on {r['cpu_model']} ({r['threads']} threads), commit {str(r['commit'])[:7]}, run "
            f"{r['run_id']}: {setting}, batch {', '.join(map(str, batches)) or 'as in each row'}; each ratio over fp32 "
            "eager at 50 PLMS steps per image (composed from the measured stages), median [min-max] over fresh-process rounds. "
            "Quality: the trained reference model (docs/reference-model.md), adherence delta as a share of the "
            "caption's claims with its 95% bootstrap interval, paired against that model's converged fp32 solve "
            "(docs/judging.md); what may not transfer to SD 1.5 is on the page.")


def markdown(results: pd.DataFrame) -> str:
    found = rows(results)
    if not found:
        return "No answer yet: 10_ladder has no rows in this report."
    cols = list(found[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") if c != "stack" else f"`{r[c]}`" for c in cols) + " |"
              for r in found]
    return "\n".join(lines) + "\n\n" + _where(results)


def block(results: pd.DataFrame) -> str:
    return f"{BEGIN}\n{markdown(results)}\n{END}"


def replace_block(text: str, results: pd.DataFrame) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise MissingBlock(f"no answer block: the file must hold a line {BEGIN!r} and, after it, {END!r}")
    return text[:start] + block(results) + text[end + len(END):]
