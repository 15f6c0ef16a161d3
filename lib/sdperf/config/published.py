"""Figures published by the seeds and reference write-ups, transcribed with their source and its URL for
side-by-side tables."""
from __future__ import annotations

import pandas as pd

from sdperf.core import tables


def load() -> pd.DataFrame:
    return tables.table("published_inference.csv")


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


def url(source: str) -> str:
    """The public address of `source`'s write-up, so a table can cite it instead of a file outside the repo."""
    urls = load().drop_duplicates("source").set_index("source")["url"]
    if source not in urls.index:
        raise KeyError(f"no published source {source!r}; valid sources: {', '.join(urls.index)}")
    return str(urls[source])


def cite(source: str) -> str:
    """'source (https://...)': how a published-vs-measured row names where its figure comes from."""
    return f"{source} ({url(source)})"
