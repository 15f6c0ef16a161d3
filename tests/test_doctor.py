"""`sdperf doctor`: every catalog rung with a verdict and a reason, for a GPU profile on this CPU machine too."""
from __future__ import annotations

import dataclasses
import time

from sdperf.measure import doctor
from sdperf.cli import main
from sdperf.optimizations import catalog
from sdperf.config.profiles import load_profile


def test_every_rung_has_a_verdict_and_a_reason_for_a_gpu_profile_here(capsys):
    start = time.perf_counter()
    assert main(["doctor", "--profile", "sd15-a10g"]) == 0
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    for key in catalog.keys():
        assert key in out, key
    rows = {r["rung"]: r for r in doctor.rungs(load_profile("sd15-a10g", check_runtime=False))}
    assert set(rows) == set(catalog.keys())
    assert all(r["reason"] for r in rows.values())
    import torch

    if not torch.cuda.is_available():  # on this CPU machine the GPU rungs say why not, in their own words
        assert rows["cuda_graphs"]["verdict"] == doctor.WONT_RUN and "cuda" in rows["cuda_graphs"]["reason"].lower()
        assert "device 'cuda' is not available on this machine" in out
    assert elapsed < 60, f"took {elapsed:.0f}s"


def test_the_verdict_follows_the_techniques_own_check(monkeypatch):
    profile = load_profile("smoke", check_runtime=False)
    key = catalog.keys()[0]
    tech = catalog.get(key)
    refused = dataclasses.replace(tech, availability=lambda ctx: (False, "a reason from the check"))
    monkeypatch.setattr(catalog, "get", lambda k: refused)
    row = next(r for r in doctor.rungs(profile) if r["rung"] == key)
    assert (row["verdict"], row["reason"]) == (doctor.WONT_RUN, "a reason from the check")


def test_the_record_is_written_and_shown_at_the_top_of_the_report(scratch_reports, capsys):
    import json

    from sdperf.core import environment
    from sdperf.report import report
    from sdperf.store.results import Recorder

    assert main(["doctor", "--profile", "smoke", "--record"]) == 0
    found = json.loads((scratch_reports / "smoke" / doctor.RECORD_NAME).read_text())
    assert {r["rung"] for r in found["rungs"]} == set(catalog.keys())
    assert found["machine"] == environment.fingerprint("cpu") and found["commit"] == environment.git_commit()
    Recorder("00_x", "smoke", environment.record("smoke", "cpu")).add("unet", "latency", 1.0, "s", n=1,
                                                                         method="a test row")

    page = report.write_index("smoke").read_text()
    top = page.index("What can run here")
    assert top < page.index("id='environment'")
    assert doctor.tally(found["rungs"]) in page.replace("&#x27;", "'")
    assert "not the machine of the rows below" not in page

    found["machine"] = "another0cpu"  # a record from elsewhere is shown as such, never passed off as this one's
    (scratch_reports / "smoke" / doctor.RECORD_NAME).write_text(json.dumps(found))
    assert "It was recorded on machine another0cpu, not the machine of the rows below" in report.write_index(
        "smoke").read_text()


def test_the_report_says_when_there_is_no_record(scratch_reports):
    from sdperf.report import report

    (scratch_reports / "smoke").mkdir(parents=True)
    page = report.write_index("smoke").read_text()
    assert "No <code>sdperf doctor</code> record for this profile yet" in page


def test_a_gpu_profile_nobody_ran_says_not_yet_measured_on_a_gpu(scratch_reports):
    from sdperf.report import report
    from sdperf.store.results import Recorder

    page = report.write_index("sd15-a10g").read_text()
    assert "Not yet measured on a GPU." in page and "make study PROFILE=sd15-a10g" in page
    assert "id='published'" in page  # the published figures its rows will be set against
    from sdperf.core import environment

    Recorder("00_x", "sd15-a10g", environment.record("sd15-a10g", "cpu")).add("unet", "latency", 1.0, "s", n=1,
                                                                         method="a test row")
    assert "Not yet measured" not in report.write_index("sd15-a10g").read_text()
