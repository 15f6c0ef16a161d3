"""The run's expected time: from each part's last timed run, per worker for the rounds, said with its source."""
from __future__ import annotations

import json

from sdperf.run import eta


def _stamp(path, **kw):
    path.write_text(json.dumps({"status": "ok", "finished_utc": "2026-11-26T00:00:00Z", **kw}))
    return path


def test_each_part_is_expected_from_its_last_run_here_or_says_where_its_figure_comes_from(tmp_path):
    here = eta.notebook(_stamp(tmp_path / "a.json", duration_s=120.0, machine="m1"), "a", "m1")
    there = eta.notebook(_stamp(tmp_path / "b.json", duration_s=60.0, machine="m2"), "b", "m1", "Intel Xeon")
    failed = eta.notebook(_stamp(tmp_path / "c.json", duration_s=5.0, machine="m1", status="failed"), "c", "m1")
    assert (here.seconds, there.seconds, failed.seconds) == (120.0, 60.0, None)
    assert here.source.startswith("the last run here (2026") and "on Intel Xeon" in there.source
    r = eta.rounds(_stamp(tmp_path / "r.json", duration_s=1000.0, workers=100, machine="m1"), 30, "m1")
    assert r.seconds == 300.0 and "10 s per worker x 30" in r.source  # a resumed run launches fewer workers
    assert eta.rounds(tmp_path / "missing.json", 0, "m1").seconds == 0.0
    text = eta.plan_text([r, here, there])
    assert text.startswith("expected time: about 8 min; from the last run here, the profile's last run on record, on Intel Xeon")
    assert eta.plan_text([r, here, failed]).startswith("expected time: at least 7 min") and "c" in \
        eta.plan_text([r, here, failed]).split("no run on record of ")[1]
    assert eta.left([r, here, there], {eta.ROUNDS}) == 180.0
    # nothing stale (a second run on the same commit): no part to run is not an unknown time
    assert eta.plan_text([]) == ("expected time: none: every selected notebook already ran for this commit "
                                 "(--force measures again)")
    assert eta.left([here, failed], set()) is None


def test_with_no_run_on_record_the_profiles_own_estimate_is_used_and_named(tmp_path):
    guess = {"measured_on": "AMD EPYC, 2 cores, commit abc", "rounds_per_worker_s": 4.0,
             "notebooks_s": {"a": 100.0}}
    missing = tmp_path / "none.json"
    r = eta.rounds(missing, 30, "m1", "", guess)
    a, b = eta.notebook(missing, "a", "m1", "", guess), eta.notebook(missing, "b", "m1", "", guess)
    assert (r.seconds, a.seconds, b.seconds) == (120.0, 100.0, None)
    assert "4 s per worker x 30" in r.source and "measured on AMD EPYC, 2 cores, commit abc" in a.source
    assert eta.plan_text([r, a]) == ("expected time: about 4 min; from the profile's estimate (measured on AMD EPYC, "
                                     "2 cores, commit abc)")
    assert eta.plan_text([r, a, b]).endswith("; no run on record of b")
    # a run on record wins over the estimate: it is this profile's own last run
    here = eta.notebook(_stamp(tmp_path / "a.json", duration_s=50.0, machine="m1"), "a", "m1", "", guess)
    assert here.seconds == 50.0 and here.kind == "the last run here"
