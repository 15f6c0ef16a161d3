"""Figures published by the seeds and reference write-ups, transcribed with their source for side-by-side tables."""
from __future__ import annotations

from importlib import resources

import pandas as pd


def load() -> pd.DataFrame:
    with resources.files("sdperf.data").joinpath("published_inference.csv").open() as fh:
        return pd.read_csv(fh)


def select(source: str, **equal) -> pd.DataFrame:
    df = load()
    df = df[df["source"] == source]
    for key, value in equal.items():
        df = df[df[key] == value]
    if df.empty:
        raise KeyError(f"no published rows for {source!r} with {equal}")
    return df.reset_index(drop=True)


def value(source: str, **equal) -> float:
    rows = select(source, **equal)
    if len(rows) != 1:
        raise KeyError(f"{len(rows)} published rows match {source!r} {equal}; need exactly one")
    return float(rows.loc[0, "value"])
