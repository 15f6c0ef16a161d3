"""Published vs measured: every seed claim and anchor the study compares with, in one table built from rows.

The published side is sdperf.config.published's claims; the measured side is never typed but read from the results
rows each claim names (a `Lookup`), or "not measured here: <the row's own reason>".
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from sdperf.config import published
from sdperf.store.results import with_verdicts

NOT_MEASURED = "not measured here"
COLUMNS = ["source", "url", "url_note", "hardware", "settings", "claim", "published", "published_unit",
           "published_detail", "measured_x", "measured", "measured_what", "method", "why_they_differ"]
ROW_COLUMNS = ("notebook", "scenario", "metric", "value", "unit", "p10", "p90", "lo", "hi", "status", "method", "key",
               "batch_size", "note", "time_utc")  # what is read of a results.csv row (sdperf.store.results)
ALTERNATIVE = "|"  # measured key "a|b": the first key with a measured row wins (e.g. TensorRT where it runs)
CLAIM_NAMES = {"what": "claim", "value": "published", "unit": "published_unit", "detail": "published_detail",
               "why": "why_they_differ"}


def claims() -> pd.DataFrame:
    """Every published claim, in the published table's order, with where its measured figure lives (`measured_*`)."""
    return published.compared().rename(columns=CLAIM_NAMES)


@dataclass
class Lookup:
    """Where a claim's measured figure lives in results.csv."""

    notebook: str = ""
    key: str = ""
    scenario: str = ""
    batch: str = ""
    metric: str = ""

    def describe(self) -> str:
        where = [f"notebook {self.notebook}" if self.notebook else "any notebook",
                 f"key {self.key}" if self.key else f"scenario '{self.scenario}...'"]
        if self.batch:
            where.append(f"batch {self.batch}")
        return ", ".join(where) + f", metric {self.metric}"


def _text(col: pd.Series) -> pd.Series:
    return col.fillna("").astype(str)


def _rows(results: pd.DataFrame, look: Lookup) -> pd.DataFrame:
    """Every row of `look`, any metric and status: by catalog key or scenario prefix, notebook and batch size."""
    r = results
    if r.empty:
        return r
    scenario = _text(r["scenario"])
    keep = pd.Series(True, index=r.index)
    if look.notebook:
        keep &= _text(r["notebook"]) == look.notebook
    if look.key:
        key = _text(r["key"]) if "key" in r else pd.Series("", index=r.index)
        keep &= (key == look.key) | ((key == "") & scenario.str.startswith(look.key + ","))
    if look.scenario:
        keep &= scenario.str.startswith(look.scenario)
    if look.batch:
        keep &= r["batch_size"] == int(look.batch)
    return r[keep]


def _measured(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The ok rows of `metric` with a value, one per scenario (the newest where a scenario repeats)."""
    ok = rows[(_text(rows["status"]) == "ok") & (_text(rows["metric"]) == metric) & rows["value"].notna()]
    if "time_utc" in ok:
        ok = ok.sort_values("time_utc", kind="stable")
    return ok.drop_duplicates("scenario", keep="last")


def _reason(rows: pd.DataFrame, look: Lookup) -> str:
    """The first not-measured row's own reason, or what was looked for and not found."""
    not_ok = rows[_text(rows["status"]) != "ok"]
    if len(not_ok):
        r = not_ok.iloc[0]
        status = str(r["status"]).replace("_", " ")
        note = str(r["note"]) if pd.notna(r["note"]) else ""
        return f"{status}: {note.removeprefix(status + ': ')}".strip()  # the Recorder's notes repeat the status
    if len(rows):
        return f"rows of {look.describe().rsplit(', metric', 1)[0]} exist, but none of metric {look.metric}"
    return f"no row of {look.describe()} in results.csv"


def _lookups(claim) -> list[Lookup]:
    keys = [k for k in str(claim.measured_key).split(ALTERNATIVE) if k] or [""]
    return [Lookup(claim.measured_notebook, k, claim.measured_scenario, claim.measured_batch, claim.measured_metric)
            for k in keys]


def _over(claim) -> Lookup:
    over = str(claim.measured_over)
    is_key = ":" in over  # a catalog key; a scenario prefix otherwise
    return Lookup(claim.measured_notebook, over if is_key else "", "" if is_key else over, claim.measured_batch,
                  claim.measured_metric)


def _num(v: float) -> str:
    """Three significant digits, trailing zeros kept (1.20, not 1.2); thousands in full."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:#.3g}".rstrip(".")


def _span(lo, hi, label: str = "") -> str:
    if pd.isna(lo) or pd.isna(hi):
        return ""
    sep = " to " if min(lo, hi) < 0 else "-"
    return f" [{label}{_num(lo)}{sep}{_num(hi)}]"


def _figure(row) -> str:
    """'1.43x [1.36-1.43]' from a row: its value, unit and range (min-max over rounds, or p10-p90 said so)."""
    unit = str(row["unit"]) if pd.notna(row.get("unit")) else ""
    text = _num(float(row["value"])) + ("x" if unit == "x" else f" {unit}" if unit else "")
    if pd.notna(row.get("lo")) and pd.notna(row.get("hi")):
        return text + _span(row["lo"], row["hi"])
    return text + _span(row.get("p10"), row.get("p90"), "p10-p90 ")


def _method(rows: pd.DataFrame) -> str:
    """The rows' method column, or (rows that predate it) the first clause of their note."""
    for col in ("method", "note"):
        if col in rows:
            v = rows[col].dropna().astype(str)
            v = v[v != ""]
            if len(v):
                return v.iloc[0] if col == "method" else v.iloc[0].split("; ")[0]
    return ""


def _suffix(scenario: str, look: Lookup) -> str:
    prefix = look.scenario or look.key
    return scenario[len(prefix):] if scenario.startswith(prefix) else scenario


def _ratio(results: pd.DataFrame, claim, found: pd.DataFrame, look: Lookup) -> tuple[float | None, str, str]:
    """Numerator rows over the denominator rows named by measured_over, paired by the rest of their scenario."""
    over_look = _over(claim)
    over_rows = _rows(results, over_look)
    below = _measured(over_rows, claim.measured_metric)
    if below.empty:
        return None, f"{NOT_MEASURED}: the denominator: {_reason(over_rows, over_look)}", ""
    by_suffix = {_suffix(s, over_look): v for s, v in zip(below["scenario"], below["value"].astype(float))}
    parts = []
    for s, v in zip(found["scenario"], found["value"].astype(float)):
        d = by_suffix.get(_suffix(s, look), below["value"].astype(float).iloc[0] if len(below) == 1 else None)
        if d:
            parts.append((s, v / d))
    if not parts:
        return None, f"{NOT_MEASURED}: no denominator row pairs with {', '.join(found['scenario'])}", ""
    text = "; ".join(f"{_num(x)}x ({s})" if len(parts) > 1 else f"{_num(x)}x" for s, x in parts)
    return parts[0][1], text + " (ratio of medians)", _method(pd.concat([found, below]))


def measure(results: pd.DataFrame, claim) -> tuple[float | None, str, str]:
    """(the first measured figure, the measured cell's text, the method) for one claim, from `results`."""
    reasons = []
    for look in _lookups(claim):
        rows = _rows(results, look)
        found = _measured(rows, look.metric)
        if found.empty:
            reasons.append((rows.empty, _reason(rows, look)))  # a row's own reason before "no row"
            continue
        if claim.measured_over:
            return _ratio(results, claim, found, look)
        texts = [_figure(r) + (f" ({r['scenario']})" if len(found) > 1 else "") for _, r in found.iterrows()]
        return float(found["value"].iloc[0]), "; ".join(texts), _method(found)
    return None, f"{NOT_MEASURED}: {sorted(reasons, key=lambda r: r[0])[0][1]}", ""


def table(results: pd.DataFrame) -> pd.DataFrame:
    if "batch_size" not in results:  # rows not read through sdperf.store.results (a table built by hand)
        results = with_verdicts(results.reindex(columns=list(dict.fromkeys([*results.columns, *ROW_COLUMNS])))
                                .drop(columns=["batch_size"]))
    results = results.reindex(columns=list(dict.fromkeys([*results.columns, *ROW_COLUMNS])))
    out = []
    for c in claims().itertuples():
        x, measured, method = measure(results, c)
        out.append({"source": c.source, "url": c.url, "url_note": c.url_note, "hardware": c.hardware,
                    "settings": c.settings, "claim": c.claim, "published_unit": c.published_unit,
                    "published": None if pd.isna(c.published) else float(c.published),
                    "published_detail": c.published_detail, "measured_x": x, "measured": measured,
                    "measured_what": c.measured_what if x is not None else "", "method": method,
                    "why_they_differ": c.why_they_differ})
    return pd.DataFrame(out, columns=COLUMNS)
