"""The published training-throughput tables (NeMo A100/H100 node sweep and comparison, MosaicML A100 sweep),
transcribed into sdperf/data/published_training.csv with their source URL and hardware."""
from __future__ import annotations

import pandas as pd

from sdperf.training import scaling
from sdperf.core import tables

FILE = "published_training.csv"
NEMO, NEMO_AB, MOSAIC = "NeMo SD training", "NeMo SD training A100 vs H100", "MosaicML diffusion"


def load() -> pd.DataFrame:
    return tables.table(FILE)


def _curve(row) -> str:
    chip = "H100" if "H100" in row.hardware else "A100"
    who, model = ("NeMo DGX", "SD v2") if row.source == NEMO else ("MosaicML", "SD2-base UNet")
    return f"{who} {chip}, {model}, {row.resolution}px"


def throughput() -> pd.DataFrame:
    """samples/s per curve and size (GPUs), one row each, with the curve's name and its source."""
    df = load()
    df = df[(df.metric == "samples_per_s") & df.source.isin([NEMO, MOSAIC])].copy()
    df["curve"] = [_curve(r) for r in df.itertuples()]
    return df.reset_index(drop=True)


def curves() -> pd.DataFrame:
    """Every published curve's speed-up and efficiency against its own smallest size (in GPUs)."""
    return scaling.scaling(throughput(), "gpus", "value", ["curve"])


def stated(metric: str) -> pd.DataFrame:
    """The NeMo tables' own speed-up or perfect-linear rows, to hold the computed ones against."""
    df = load()
    return df[(df.source == NEMO) & (df.metric == metric)].reset_index(drop=True)


def a100_to_h100() -> pd.DataFrame:
    """H100 over A100 samples/s at each node count of the NeMo sweep, and the 4-node comparison table."""
    nemo = throughput()
    nemo = nemo[nemo.source == NEMO].assign(chip=lambda d: d.hardware.str.extract(r"(A100|H100)")[0])
    sweep = scaling.ratio(nemo, "nodes", "chip", "H100", "A100").assign(table="node sweep (samples/s)")
    ab = load()
    ab = ab[(ab.source == NEMO_AB) & (ab.metric == "global_batches_per_s")]
    ab = ab.assign(chip=ab.hardware.str.extract(r"(A100|H100)")[0])
    comp = scaling.ratio(ab, "nodes", "chip", "H100", "A100").assign(table="A100 vs H100 table (global batches/s)")
    stated_ratio = float(load().query("source == @NEMO_AB and metric == 'speedup'")["value"].iloc[0])
    comp["stated"] = stated_ratio
    return pd.concat([sweep, comp], ignore_index=True)
