"""Speed-up and scaling efficiency, the way the NeMo table states them, for published and measured curves alike.

For throughput X(N) at size N (GPUs, nodes or ranks) and its curve's smallest size N0: scale = N / N0, speed-up =
X(N) / X(N0), perfect linear = X(N0) * scale, efficiency = speed-up / scale. Weak scaling holds the per-rank batch
fixed, strong scaling the global batch; in samples/s both efficiencies are that formula (per-rank work fixed: X(N)/N
against X(N0)/N0; total work fixed: the time ratio T(N0) / (T(N) * scale)).
"""
from __future__ import annotations

import pandas as pd

from sdperf.config import published


def scaling(table: pd.DataFrame, size: str, throughput: str, by: list[str] | tuple = ()) -> pd.DataFrame:
    """Adds base_size, scale, speedup, perfect_linear and efficiency to each row, per group of `by`."""
    if table.empty:
        return table.assign(base_size=[], scale=[], speedup=[], perfect_linear=[], efficiency=[])
    parts = []
    groups = table.groupby(list(by), sort=False, dropna=False) if by else [((), table)]
    for _, group in groups:
        group = group.sort_values(size)
        base = group.iloc[0]
        scale = group[size] / base[size]
        speedup = group[throughput] / base[throughput]
        parts.append(group.assign(base_size=base[size], scale=scale, speedup=speedup,
                                  perfect_linear=base[throughput] * scale, efficiency=speedup / scale))
    return pd.concat(parts, ignore_index=True)


def _measured_ok(measured: pd.DataFrame) -> pd.DataFrame:
    ok = measured[measured["status"] == "ok"]
    return ok[~ok["control"].astype(bool)] if "control" in ok else ok


def weak(measured: pd.DataFrame) -> pd.DataFrame:
    """Per engine and per-rank batch: the global batch grows with the world size."""
    by = ["engine", "per_rank_batch"]
    return scaling(_measured_ok(measured), "world_size", "samples_per_s", by).assign(kind="weak")


def strong(measured: pd.DataFrame) -> pd.DataFrame:
    """Per engine and global batch, where at least two world sizes share it: the per-rank batch shrinks."""
    ok = _measured_ok(measured)
    sizes = ok.groupby(["engine", "global_batch"])["world_size"].transform("nunique")
    return scaling(ok[sizes >= 2], "world_size", "samples_per_s", ["engine", "global_batch"]).assign(kind="strong")


def equal_threads(measured: pd.DataFrame) -> pd.DataFrame:
    """DDP efficiency against one rank given each rank's threads: X(N) / (N * X_control). Where ranks share cores,
    this removes thread scaling and leaves what data parallelism itself costs (gradient all-reduce, a process per
    rank, duplicated optimizer work)."""
    ok = measured[measured["status"] == "ok"]
    control = ok[ok["control"].astype(bool)] if "control" in ok else ok.iloc[0:0]
    rows = []
    for c in control.itertuples():
        same = ok[(ok.engine == "ddp") & ~ok["control"].astype(bool) & (ok.per_rank_batch == c.per_rank_batch)
                  & (ok.threads_per_rank == c.threads_per_rank) & (ok.world_size > 1)]
        for r in same.itertuples():
            rows.append({"per_rank_batch": r.per_rank_batch, "threads_per_rank": r.threads_per_rank,
                         "world_size": r.world_size, "samples_per_s": r.samples_per_s,
                         "control_samples_per_s": c.samples_per_s,
                         "efficiency": r.samples_per_s / (r.world_size * c.samples_per_s)})
    return pd.DataFrame(rows, columns=["per_rank_batch", "threads_per_rank", "world_size", "samples_per_s",
                                       "control_samples_per_s", "efficiency"])


def ratio(table: pd.DataFrame, key: str, column: str, numerator: str, denominator: str,
          value: str = "value") -> pd.DataFrame:
    """numerator / denominator of `value` at each `key` both have (e.g. H100 over A100 per node count)."""
    wide = table.pivot_table(index=key, columns=column, values=value, aggfunc="first")
    both = wide[[numerator, denominator]].dropna()
    return pd.DataFrame({key: both.index, numerator: both[numerator].values, denominator: both[denominator].values,
                         "ratio": (both[numerator] / both[denominator]).values})


def published_curves() -> pd.DataFrame:
    """Every published training curve's speed-up and efficiency against its own smallest size (in GPUs)."""
    return scaling(published.throughput(), "gpus", "value", ["curve"])


def a100_to_h100() -> pd.DataFrame:
    """H100 over A100 samples/s at each node count of the NeMo sweep, and NeMo's 4-node comparison table with the
    speed-up it states."""
    nemo = published.throughput()
    nemo = nemo[nemo.source == published.NEMO].assign(chip=lambda d: d.hardware.str.extract(r"(A100|H100)")[0])
    sweep = ratio(nemo, "nodes", "chip", "H100", "A100").assign(table="node sweep (samples/s)")
    ab = published.select(published.NEMO_AB, metric="global_batches_per_s")
    ab = ab.assign(chip=ab.hardware.str.extract(r"(A100|H100)")[0])
    comp = ratio(ab, "nodes", "chip", "H100", "A100").assign(table="A100 vs H100 table (global batches/s)")
    comp["stated"] = published.value(published.NEMO_AB, metric="speedup")
    return pd.concat([sweep, comp], ignore_index=True)
