"""The notebooks under nbval in `make test`'s one pytest session with the unit tests: each notebook's kernel starts
with the profile and reports folder that make gave the session (SDPERF_PROFILE=smoke, a scratch SDPERF_REPORTS_DIR),
whatever a unit test that ran before it on the same xdist worker left in os.environ (tests/conftest.py's session
fixture removes SDPERF_PROFILE and points SDPERF_REPORTS_DIR elsewhere for the unit tests, until the session ends).
"""
from __future__ import annotations

import os

import pytest

KERNEL_ENV = ("SDPERF_PROFILE", "SDPERF_REPORTS_DIR")
GIVEN = {k: os.environ.get(k) for k in KERNEL_ENV}  # read when pytest loads this file: before any test has run


def _put(values: dict) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """nbval starts a notebook's kernel while setting up its first cell: the kernel (and every worker process it
    launches) inherits the session's values; the unit tests' own values are back once the cell is set up."""
    saved = {k: os.environ.get(k) for k in KERNEL_ENV}
    _put(GIVEN)
    try:
        yield
    finally:
        _put(saved)
