"""The study's transcribed tables, sdperf/data/*.csv, read by file name from the installed package (package-data)."""
from __future__ import annotations

from importlib import resources

PACKAGE = "sdperf.data"


def table(name: str, **read_csv):
    """sdperf/data/`name` as a DataFrame (pandas imported here, so that a captions error comes fast)."""
    import pandas as pd

    with resources.files(PACKAGE).joinpath(name).open() as fh:
        return pd.read_csv(fh, **read_csv)


def file(name: str):
    """A context manager giving sdperf/data/`name` as a real file path (for readers that open paths)."""
    return resources.as_file(resources.files(PACKAGE).joinpath(name))
