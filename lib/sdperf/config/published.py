"""Every published figure the study cites, in one table (sdperf/data/published.csv), and the views its readers take.

A row is one figure: `source`, `url`, `hardware`, `settings`, `key` (its technique), `what`, `metric`, `value`, `unit`
(none for a claim), `detail` (the source's words), `why` (why it can differ from this study's). `measured` names its
results.csv row: "; "-joined `field=value` pairs (LOOKUP), `what=` last. Sizes (SIZES, `model`) come from the words.
"""
from __future__ import annotations

import pandas as pd

from sdperf.core import tables

FILE = "published.csv"
SIZES = {"resolution": r"(\d+)px", "batch_size": r"(?:^|[,;] )batch (\d+)", "gpus": r"(\d+) GPUs",
         "nodes": r"(\d+) nodes?\b"}
LOOKUP = ("notebook", "key", "scenario", "batch", "metric", "over", "what")
QUALITY = ("fid", "fid_change", "clip_score", "latent_mse", "n_images")
CHANGES = ("fid_change", "latent_mse", "quality")  # what a technique costs in quality ("quality": said in words)
NEMO, NEMO_AB, MOSAIC = "NeMo SD training", "NeMo SD training A100 vs H100", "MosaicML diffusion"
CURVES = {NEMO: "NeMo DGX {chip}, SD v2, {px}px", MOSAIC: "MosaicML {chip}, SD2-base UNet, {px}px"}


def load() -> pd.DataFrame:
    """The table, text columns as strings ('' where empty), `value` a float (NaN: no figure), with the sizes."""
    df = tables.table(FILE, dtype=str, keep_default_na=False)
    df["value"] = df["value"].replace("", "nan").astype(float)
    words = df["settings"] + "; " + df["what"]
    df["model"] = df["settings"].str.split(",").str[0]
    for size, pattern in SIZES.items():
        df[size] = words.str.findall(pattern).str[-1].astype(float)
    return df


def select(source: str, **equal) -> pd.DataFrame:
    df = load()
    df = df[df["source"] == source]
    for column, value in equal.items():
        df = df[df[column] == value]
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


def lookup(measured: str) -> dict[str, str]:
    """A `measured` cell as its fields, every one of LOOKUP present ('' where not given)."""
    head, _, what = measured.partition("what=")
    fields = dict(part.split("=", 1) for part in head.split("; ") if part) | {"what": what}
    if set(fields) - set(LOOKUP):
        raise ValueError(f"measured {measured!r}: unknown field(s) {sorted(set(fields) - set(LOOKUP))}; {LOOKUP}")
    return {name: fields.get(name, "") for name in LOOKUP}


def compared() -> pd.DataFrame:
    """The rows the report sets beside a measurement, each `measured` field as a column `measured_<field>`."""
    df = load().query("measured != ''").reset_index(drop=True)
    fields = pd.DataFrame([lookup(m) for m in df["measured"]], columns=list(LOOKUP))
    return pd.concat([df, fields.add_prefix("measured_")], axis=1)


def quality() -> pd.DataFrame:
    """The published quality figures (FID, CLIP score, their changes, latent error, a protocol's image count)."""
    df = load()
    return df[df["metric"].isin(QUALITY) & df["value"].notna()].reset_index(drop=True)


def technique_quality() -> pd.DataFrame:
    """Per catalog key, what its sources say it costs in quality, where each was measured, and the sources cited."""
    df = load()
    df = df[(df["key"] != "") & df["metric"].isin(CHANGES)].assign(
        where=lambda d: (d.hardware + ", " + d.settings).str.strip(", "), cited=lambda d: d.source + " (" + d.url + ")")
    join = lambda texts: "; ".join(dict.fromkeys(filter(None, texts)))  # noqa: E731  (each text once, in order)
    return df.groupby("key", sort=False).agg(published_cost=("detail", join), published_where=("where", join),
                                             published_source=("cited", join), source=("source", join),
                                             hardware=("hardware", join))


def throughput() -> pd.DataFrame:
    """The published training sweeps: samples/s per curve and size, one row each, with the curve's name."""
    df = load()
    df = df[(df["metric"] == "samples_per_s") & df["source"].isin([NEMO, MOSAIC])].copy()
    df["gpus"] = df["gpus"].astype(int)
    df["curve"] = [CURVES[r.source].format(chip="H100" if "H100" in r.hardware else "A100", px=int(r.resolution))
                   for r in df.itertuples()]
    return df.reset_index(drop=True)
