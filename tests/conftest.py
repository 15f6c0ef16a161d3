"""Shared fixtures: every test writes reports into a scratch folder and sees no profile override."""
from __future__ import annotations

import pytest


def pytest_sessionstart(session):
    """sdperf.core.quiet's warning filters in force for every test, as in a notebook or a worker: `import sdperf` during
    collection installs them inside pytest's warnings.catch_warnings, which drops them when collection ends."""
    from sdperf.core import quiet

    quiet.install()


@pytest.fixture(scope="session", autouse=True)
def session_reports(tmp_path_factory):
    """Nothing a test runs may write into the repository's reports/."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDPERF_REPORTS_DIR", str(tmp_path_factory.mktemp("reports")))
        mp.delenv("SDPERF_PROFILE", raising=False)
        # each session's own machine-wide run lock, and no worker re-measured for load: the other xdist worker and
        # a shared CI host are load (tests/test_contention.py sets both where it tests them)
        mp.setenv("SDPERF_MACHINE_LOCK", str(tmp_path_factory.mktemp("lock") / "machine.lock"))
        mp.setenv("SDPERF_CONTENTION_SHARE", "1")
        yield


@pytest.fixture
def scratch_reports(tmp_path, monkeypatch):
    """A reports folder of this test's own, for tests that inspect the whole results table."""
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    return tmp_path / "reports"


@pytest.fixture(scope="session")
def smoke():
    from sdperf.config.profiles import load_profile

    return load_profile("smoke")


@pytest.fixture(scope="session")
def tiny_pipe(smoke):
    """One tiny fp32 pipeline for the read-only tests (building one takes seconds)."""
    from sdperf.model.pipelines import build_pipeline

    return build_pipeline(smoke)


@pytest.fixture(scope="module")
def workload(smoke):
    """The smoke profile's batch-1 generation; a module timing other steps defines its own."""
    from sdperf.model.generation import Workload

    return Workload.from_profile(smoke, batch_size=1)


@pytest.fixture(scope="module")
def reference(tiny_pipe, workload):
    """The tiny pipeline's fp32 generation of `workload`: the int8 modules' drift baseline."""
    from sdperf.model.generation import generate

    return generate(tiny_pipe, workload)


@pytest.fixture(autouse=True)
def own_run_keys(monkeypatch):
    """A test that runs `sdperf run` in-process sets the run's ledger key and log (sdperf.ledger, sdperf.worker);
    they end with the test, so the next test keys its rounds by its own run id as a notebook opened alone does."""
    for name in ("SDPERF_LEDGER_KEY", "SDPERF_LOG"):
        monkeypatch.setenv(name, "")  # recorded as absent before: removed again after the test
        monkeypatch.delenv(name)
