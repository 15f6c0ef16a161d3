"""The study's transcribed tables, sdperf/data/*.csv (published figures with their sources, compatibility notes):
read one way, by file name, from the installed package (package-data in pyproject.toml).

Each caller passes the read options its table needs (`dtype`, `keep_default_na`); the location and the opening
live here only, so a table moved or renamed breaks one line, not seven.
"""
from __future__ import annotations

from importlib import resources

PACKAGE = "sdperf.data"


def table(name: str, **read_csv):
    """sdperf/data/`name` as a pandas DataFrame (`read_csv`: pandas.read_csv options). pandas is imported here, not
    above: `sdperf generate` reads its captions through this module and must fail on a bad file in well under a
    second, before anything heavy is imported (tests/test_imagegen_inputs.py)."""
    import pandas as pd

    with resources.files(PACKAGE).joinpath(name).open() as fh:
        return pd.read_csv(fh, **read_csv)


def file(name: str):
    """A context manager giving sdperf/data/`name` as a real file path (for readers that open paths)."""
    return resources.as_file(resources.files(PACKAGE).joinpath(name))
