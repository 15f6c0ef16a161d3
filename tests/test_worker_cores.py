"""The two xdist workers of `make unit` / `make notebooks` each run on their own share of the CPUs (conftest.py), and
the processes they start inherit it; a test marked all_cores gets every CPU back while it runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ALL = os.environ.get("SDPERF_TEST_ALL_CPUS", "")
pinned = pytest.mark.skipif(not ALL, reason="one worker, or more workers than CPUs: conftest.py pins nothing")


def _all() -> list[int]:
    return sorted(int(c) for c in ALL.split(","))


def _child_cpus() -> set[int]:
    code = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {int(c) for c in out.strip().split(",")}


@pinned
def test_a_worker_and_its_children_run_on_the_workers_share():
    index, count = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")), int(
        os.environ["PYTEST_XDIST_WORKER_COUNT"])
    own = os.sched_getaffinity(0)
    assert own == set(_all()[index::count]) and len(own) < len(_all())
    assert _child_cpus() == own  # a notebook kernel, a round worker, a torchrun rank: the same share


@pinned
@pytest.mark.all_cores
def test_an_all_cores_test_and_its_children_run_on_every_cpu():
    assert os.sched_getaffinity(0) == set(_all()) and _child_cpus() == set(_all())
