"""Configurations compared with the fp32 eager baseline: can it run here, what does getting it ready cost, how fast
is it once warm, did the picture move, does the gain clear the noise floor; one method (sdperf.measure.rounds) for
every notebook, each configuration a stack of catalog keys, so every stand-alone row is found by key.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
import torch

from sdperf.measure import rounds
from sdperf.measure import ledger as ledgers
from sdperf.optimizations import artefacts
from sdperf.optimizations.catalog import Stack
from sdperf.core.paths import scratch_dir
from sdperf.measure.rounds import BASELINE, TWIN, Config
from sdperf.measure.study import Study

DRIFT_METRICS = (("latent_rel_error", ""), ("latent_max_abs_error", ""), ("image_max_abs_error", ""),
                 ("image_psnr_db", "dB"))
RATIO_COLUMNS = [c for _, r, _ in rounds.RATIOS for c in (r, r + "_lo", r + "_hi", r + "_verdict")]
COLUMNS = ["variant", "key", "status", "build_s", "setup_s", "setup_warm_s", "first_call_s", "first_call_warm_s",
           "latency_s", "latency_s_lo", "latency_s_hi", "s_per_image", "unet_step_s", "s_per_image_seed",
           *RATIO_COLUMNS, "peak_memory_mib", "process_peak_mib", "latent_rel_error", "image_psnr_db", "verdict",
           "rounds", "method", "note"]


def release() -> None:
    """Return freed memory (drop your references first)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Comparison:
    """run_variants' outcome: one row per configuration (baseline and twin first), the rounds, the facts."""

    table: pd.DataFrame
    measured: rounds.Measured
    facts: dict[str, dict] = field(default_factory=dict)

    @property
    def noise(self) -> dict:
        return self.measured.noise

    @property
    def method(self) -> str:
        return self.measured.method

    @classmethod
    def of(cls, m: rounds.Measured, cfgs: list[Config]) -> "Comparison":
        """The comparison of `cfgs` from rounds that measured them (rows and facts; nothing is recorded)."""
        return cls(table=_table(m, cfgs), measured=m, facts=m.facts)

    def ok(self) -> pd.DataFrame:
        return self.table[self.table.status == "ok"]

    def row(self, variant: str) -> dict | None:
        t = self.table.set_index("variant")
        return t.loc[variant].to_dict() if variant in t.index else None


def configs(items, batch_size: int = 1) -> list[Config]:
    """Configs from catalog stack keys (or (name, key) pairs, or Configs), validated before anything runs."""
    out = []
    for item in items:
        if isinstance(item, Config):
            out.append(item)
        elif isinstance(item, tuple):
            out.append(Config.of(item[1], item[0], batch_size))
        else:
            out.append(Config.of(item, None, batch_size))
    return out


def _table(m: rounds.Measured, cfgs: list[Config]) -> pd.DataFrame:
    s = m.summary.copy()
    s["variant"] = s["config"]
    s["key"] = s["stack"]
    for name, d in m.drift.items():
        for k in ("latent_rel_error", "image_psnr_db", "verdict"):
            s.loc[s.variant == name, k] = d[k]
    notes = {c.name: Stack.of(c.stack).label for c in cfgs}
    s["note"] = [n if isinstance(n, str) and n else notes.get(v, "") for v, n in zip(s.variant, s.get("note", ""))]
    s["method"] = m.method
    if "decoded" in m.raw:  # loop-only stacks: per-image figures composed with the baseline's VAE decode
        composed = set(m.raw.loc[m.raw.decoded == False, "config"])  # noqa: E712
        s.loc[s.variant.isin(composed), "method"] = m.method + rounds.WITH_BASELINE_DECODE
    order = [BASELINE, TWIN] + [c.name for c in cfgs]
    s["_o"] = s.variant.map({n: i for i, n in enumerate(order)})
    return s.sort_values("_o").drop(columns="_o").reindex(columns=COLUMNS).reset_index(drop=True)


def _setup_note(cmp: Comparison, variant: str) -> str:
    """The first round's set-up: cold, or its engine loaded from an earlier run's cache (optimizations.artefacts)."""
    facts = cmp.facts.get(variant) or {}
    if facts.get("rebuilt"):
        return f"techniques applied, first round: engine built again, since {facts['rebuilt']}"
    if artefacts.earlier_run(facts):
        return f"techniques applied, first round: engine {facts.get('artefact', '')}"
    return "techniques applied (export, build, quantize), first round: cold caches"


def record(study: Study, cmp: Comparison, batch_size: int = 1) -> None:
    """Every configuration's rows in results.csv, each with its method and its range over rounds."""
    m, rec, rows = cmp.measured, study.recorder, []
    suffix = f", batch {batch_size}"
    for r in cmp.table.itertuples():
        scenario = r.variant + suffix
        dtype = Stack.of(r.key).dtype if isinstance(r.key, str) else None
        if r.status != "ok":
            rows.append(dict(scenario=scenario, metric="latency", value=None, unit="", status=r.status,
                             note=r.note, dtype=dtype, method=m.method, key=r.key, batch_size=batch_size))
            continue
        common = dict(n=int(r.rounds), dtype=dtype, method=r.method, key=r.key, batch_size=batch_size)
        g = m.summary.set_index("config").loc[r.variant]
        for metric, col, note in (("latency", "latency_s", "median generation at the profile's steps"),
                                  ("s_per_image", "s_per_image", "latency / batch"),
                                  ("unet_step", "unet_step_s", "median UNet call on the guidance batch"),
                                  ("s_per_image_seed", "s_per_image_seed",
                                   "composed from the measured stages at 50 PLMS steps (or the scheduler's own)")):
            rows.append(_row(scenario, metric, getattr(r, col), "s", note, common, lo=g.get(col + "_lo"),
                             hi=g.get(col + "_hi")))
        rows += [_row(scenario, "build", r.build_s, "s", "fp32 pipeline built, first round", common),
                 _row(scenario, "setup", r.setup_s, "s", _setup_note(cmp, r.variant), common),
                 _row(scenario, "first_call", r.first_call_s, "s", "first call, first round: a generation of the "
                      "profile's first_call_steps (lazy compilation lands here)", common),
                 _row(scenario, "peak_memory", r.peak_memory_mib, "MiB", "this configuration's own process: peak RSS "
                      "of the steady-state calls, max over rounds", common),
                 _row(scenario, "process_peak_memory", r.process_peak_mib, "MiB",
                      "this configuration's own process, build and set-up included", common)]
        if pd.notna(r.setup_warm_s):
            rows.append(_row(scenario, "setup_warm", r.setup_warm_s, "s",
                             "later rounds: exported/compiled artefacts loaded from the scratch cache", common))
        if r.variant != BASELINE:
            for _, ratio, what in rounds.RATIOS:
                verdict, band = getattr(r, ratio + "_verdict"), m.noise[ratio]
                rows.append(_row(scenario, f"{ratio}_vs_fp32", getattr(r, ratio), "x",
                                 f"{what}; {verdict} (noise band {band[0]:.3f}-{band[1]:.3f}x)", common,
                                 lo=getattr(r, ratio + "_lo"), hi=getattr(r, ratio + "_hi"), verdict=verdict))
        d = m.drift.get(r.variant)
        if d:
            rows += [_row(scenario, k, d[k], u, d["verdict"], common) for k, u in DRIFT_METRICS]
    for _, ratio, what in rounds.RATIOS:
        lo, hi = m.noise[ratio]
        if pd.isna(lo):  # no twin ran: nothing was compared, so no noise floor to state
            continue
        rows.append(dict(scenario="noise floor" + suffix, metric=f"{ratio}_noise_band", value=hi, unit="x", lo=lo,
                         hi=hi, n=m.rounds, method=m.method, key="fp32-eager", batch_size=batch_size,
                         note=f"{what}: fp32 eager against its twin, symmetric range over rounds"))
    rec.add_many(_marked(rows, m.beside_load, suffix))


def _row(scenario: str, metric: str, value, unit: str, note: str, common: dict, **extra) -> dict:
    """One results.csv row of a configuration, its keys in the order every row has them."""
    return dict(scenario=scenario, metric=metric, value=value, unit=unit, **extra, note=note, **common)


def _marked(rows: list[dict], beside: dict[str, str], suffix: str) -> list[dict]:
    """`rows` with the mark of load on every row of a configuration (the twin: the noise floor) beside_load names."""
    if not beside:
        return rows
    scenarios = {name + suffix: why for name, why in beside.items()}
    if rounds.TWIN in beside:
        scenarios["noise floor" + suffix] = beside[rounds.TWIN]
    return [dict(r, note=f"{r.get('note') or ''}; {scenarios[r['scenario']]}".lstrip("; "))
            if r["scenario"] in scenarios else r for r in rows]


def run_variants(study: Study, items, *, batch_size: int = 1, say: Callable[[str], None] = print,
                 rounds_: int | None = None, overrides: dict | None = None, store: bool = True) -> Comparison:
    """Each configuration (catalog stack keys) measured by rounds.run, one that cannot run or fails recorded so;
    rows go to results.csv (`store` False: configurations another notebook owns and records)."""
    cfgs = configs(items, batch_size)
    scratch = scratch_dir(study.profile.name)
    engines, cross_run = artefacts.root_for(scratch, study.notebook)
    n_rounds = rounds_ or getattr(study.profile, "rounds", rounds.MIN_ROUNDS)
    # the run's shared results (sdperf.measure.ledger): what another notebook of this run measured is read back
    shared = scratch / "rounds" / ledgers.name(ledgers.run_key(), study.profile.name, n_rounds, overrides)
    try:
        m = rounds.run(study.profile, cfgs, rounds=n_rounds, scratch=scratch, overrides=overrides, say=say,
                       artefacts=engines, ledger=shared)
    finally:  # engines are gigabytes each on SD 1.5: the cross-run cache is trimmed to its cap, a private folder goes
        artefacts.release(engines, cross_run)
    cmp = Comparison.of(m, cfgs)
    if store:
        record(study, cmp, batch_size)
    return cmp


def published_row(claim: str, source: str, hardware: str, conditions: str, published: float | None,
                  measured: float | None, measured_conditions: str, unit: str = "x", detail: str = "") -> dict:
    """One line of a notebook's published-vs-measured table: both figures with the conditions of each."""
    return {"claim": claim, "source": source, "hardware": hardware, "conditions": conditions,
            "published": published, "published_detail": detail, "measured_here": measured, "unit": unit,
            "measured_conditions": measured_conditions}
