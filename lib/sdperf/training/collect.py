"""Per-rank records of one configuration -> one row: samples/s, step time, per-rank peak memory, agreement.

Ranks wait for each other in every gradient reduction, so step i takes the slowest rank's time; samples/s is the
global batch over the median step, its p10/p90 from the step time's p90/p10. Memory: each rank's peak over the timed
steps, and the part above what it held before building the UNet (runtime, libraries, dataset).

    python -m sdperf.training.collect DIR [DIR ...]    (hand-launched runs, e.g. multi-node)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd


def _mib(n) -> float:
    return n / 2**20 if n is not None else np.nan


def _nanmax(values) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.nanmax(values)) if not np.all(np.isnan(values)) else np.nan


def summarize(records: list[dict]) -> dict:
    """One configuration's row; raises ValueError when ranks are missing or disagree on what they ran."""
    if not records:
        raise ValueError("no rank records")
    world = records[0]["world_size"]
    ranks = sorted(r["rank"] for r in records)
    if ranks != list(range(world)):
        raise ValueError(f"expected records of ranks 0..{world - 1}, found {ranks}")
    first = records[0]
    steps = np.max(np.array([r["step_times_s"] for r in records]), axis=0)  # slowest rank per step
    median, p10, p90 = (float(np.percentile(steps, q)) for q in (50, 10, 90))
    mem = [_mib(r["peak_memory_bytes"]) for r in records]
    base = [_mib(r.get("baseline_memory_bytes")) for r in records]
    digests = {r["params_after"] for r in records}
    glob = first["global_batch"]
    return {
        "label": first.get("label", ""), "engine": first["engine"], "world_size": world,
        "per_rank_batch": first["per_rank_batch"], "global_batch": glob, "threads_per_rank": first["threads"],
        "total_threads": first["threads"] * world, "hosts": len({r["host"] for r in records}),
        "backend": first["backend"], "device": first["device"], "device_name": first["device_name"],
        "autocast": first["autocast"], "unet": first["unet"], "unet_parameters": first["unet_parameters"],
        "resolution": first["resolution"], "status": "ok", "samples_per_s": glob / median,
        "samples_per_s_p10": glob / p90, "samples_per_s_p90": glob / p10,
        "samples_per_s_per_rank": glob / median / world, "step_time_s": median, "step_time_p10_s": p10,
        "step_time_p90_s": p90, "timed_steps": len(steps), "first_step_s": max(r["first_step_s"] for r in records),
        "setup_s": max(r["setup_s"] for r in records), "peak_memory_mib": _nanmax(mem),
        "peak_memory_mib_per_rank": ", ".join(f"{m:.0f}" for m in mem), "memory_kind": first["memory_kind"],
        "baseline_memory_mib": _nanmax(base), "training_memory_mib": _nanmax(np.subtract(mem, base)),
        "loss_first": first["losses"][0], "loss_last": float(np.mean([r["losses"][-1] for r in records])),
        "params_identical": len(digests) == 1,
        "params_changed": all(r["params_after"] != r["params_before"] for r in records), "note": "",
    }


def read_run(folder: Path) -> dict:
    records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("rank*.json"))]
    if not records:
        raise ValueError(f"{str(folder)!r} holds no rank*.json records; expected the --out folder of a "
                         "`torchrun ... -m sdperf.training.train` run")
    return summarize(records)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sdperf.training.collect",
                                     description="one row per hand-launched training run (its --out folder)")
    parser.add_argument("folders", nargs="+", metavar="DIR")
    args = parser.parse_args(argv)
    try:
        table = pd.DataFrame([read_run(Path(d)) for d in args.folders])
    except ValueError as err:
        parser.error(str(err))
    cols = ["engine", "world_size", "per_rank_batch", "global_batch", "samples_per_s", "samples_per_s_p10",
            "samples_per_s_p90", "step_time_s", "peak_memory_mib", "params_identical"]
    print(table[cols].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
