"""The helpers that exist once (issue 34): the page's number-and-range format, the data-table loader, the
writability rule and the atomic write, each checked for what its callers rely on."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sdperf.core import paths, tables
from sdperf.report.numbers import fixed, value_range
from sdperf.store.results import atomic_write, atomic_write_bytes


def test_a_range_reads_the_same_everywhere_and_a_difference_keeps_its_signs():
    assert value_range(1.4234, 1.41, 1.4567) == "1.42x [1.41-1.46]"
    assert value_range(8.3327, 7.74, 10.18, 2, " s") == "8.33 s [7.74-10.18]"
    assert value_range(1.5, float("nan"), 2.0) == "1.50x"  # half a range is no range
    assert value_range(-0.026, -0.037, -0.017, 3, "") == "-0.026 [-0.037, -0.017]"
    assert fixed("51.2", 0) == "51"


def test_data_tables_are_read_from_the_package_by_name():
    path = Path(paths.REPO_ROOT / "lib" / "sdperf" / "data" / "published.csv")
    pd.testing.assert_frame_equal(tables.table("published.csv"), pd.read_csv(path))
    text = tables.table("published.csv", dtype=str, keep_default_na=False)  # read options pass through
    assert text.map(lambda v: isinstance(v, str)).all().all()
    with tables.file("published.csv") as f:
        assert Path(f).read_bytes() == path.read_bytes()


def test_what_blocks_a_folder_is_named(tmp_path):
    assert paths.blocking(tmp_path) is None and paths.blocking(tmp_path / "new" / "deeper") is None
    afile = tmp_path / "results.csv"
    afile.write_text("x")
    assert paths.blocking(afile) == afile  # a file where a folder belongs
    assert paths.blocking(afile / "figures") == afile  # cannot be made under a file


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "weights.safetensors"
    atomic_write_bytes(path, b"old")

    def half_then_fail(tmp: str):
        Path(tmp).write_bytes(b"ne")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(path, half_then_fail)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == [path.name]
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(b"new"))
    assert path.read_bytes() == b"new"
