"""`sdperf doctor`: every rung of the catalog with "will run" or the exact reason it won't, for this machine and a
profile, in seconds and without building a model. The reasons are the techniques' own availability checks, the ones
the workers ask; the profile's device is reported, not raised, so a GPU profile can be examined without a GPU.
"""
from __future__ import annotations

import os

from sdperf.core.errors import ConfigError
from sdperf.config.profiles import Profile, check_device

WILL_RUN, WONT_RUN = "will run", "won't run"


def machine_lines(profile: Profile) -> list[str]:
    from sdperf.core import environment
    from sdperf.measure import memory

    isa = environment.cpu_isa()
    have = ", ".join(f for f, on in isa.items() if on) or "none of those checked"
    lacking = ", ".join(f for f, on in isa.items() if not on) or "none"
    lines = [f"CPU: {environment.cpu_model()} (family/model/stepping {environment.family_model_stepping()}), "
             f"{environment.physical_cores()} cores, {os.cpu_count()} logical CPUs, {environment.memory_gib()} GiB",
             f"ISA present: {have}; absent: {lacking}"]
    room = memory.available()
    lines.append(f"memory available to a worker now: {room.mib:,.0f} MiB ({room.source}); each rung's "
                 "peak_estimate_mib is its worker's estimated peak at batch 1 (sdperf.measure.memory)")
    lines.append("fp32 eager baseline workers: " + "; ".join(
        f"batch {b}: {memory.preflight(profile, 'fp32-eager', b, room=room)[1]}" for b in profile.batch_sizes))
    try:
        check_device(profile.name, profile.device, profile.dtype)
        lines.append(f"profile {profile.name!r}: device {profile.device} with {profile.dtype}: available")
    except ConfigError as exc:
        lines.append(f"profile {profile.name!r}: {exc}")
    return lines


def rungs(profile: Profile) -> list[dict]:
    """One row per catalog key: family, notebook, verdict, reason and its worker's estimated peak at batch 1."""
    from sdperf.measure import memory
    from sdperf.optimizations import catalog

    ctx = catalog.Context(profile)
    room = memory.available()
    out = []
    for key in catalog.keys():
        tech = catalog.get(key)
        try:
            ok, reason = tech.availability(ctx)
        except Exception as exc:  # noqa: BLE001 - a check that cannot even run is a reason the rung won't
            ok, reason = False, f"its availability check failed: {type(exc).__name__}: {exc}"
        est = memory.estimate(profile, key, 1)
        if ok:
            ok, why = memory.preflight(profile, key, 1, room=room)
            reason = reason if ok else why
        out.append({"rung": key, "family": tech.family, "notebook": tech.notebook,
                    "verdict": WILL_RUN if ok else WONT_RUN, "peak_estimate_mib": round(est.mib), "reason": reason})
    return out


def tally(rows: list[dict]) -> str:
    will = sum(r["verdict"] == WILL_RUN for r in rows)
    return f"{will} of {len(rows)} rungs will run here; {len(rows) - will} won't, each with its reason"


def report(profile: Profile, found: dict | None = None) -> str:
    """The doctor's text: the machine, then one line per rung (from `found`, a record(), when already computed)."""
    import pandas as pd

    found = found or {"machine_lines": machine_lines(profile), "rungs": rungs(profile)}
    table = pd.DataFrame(found["rungs"])
    head = found["machine_lines"] + [tally(found["rungs"]) + ":"]
    with pd.option_context("display.max_colwidth", 160, "display.width", 250):
        return "\n".join(head) + "\n" + table.to_string(index=False)


RECORD_NAME = "doctor.json"


def record(profile: Profile) -> dict:
    """What `sdperf doctor` found, with where and when, stored beside a run's results for the report's top."""
    import datetime as dt

    from sdperf.core import environment

    return {"profile": profile.name, "machine": environment.fingerprint(profile.device),
            "commit": environment.git_commit(),
            "time_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine_lines": machine_lines(profile), "rungs": rungs(profile)}


def write_record(found: dict):
    import json

    from sdperf.core import paths
    from sdperf.store.results import atomic_write_text

    path = paths.profile_reports(found["profile"]) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(found, indent=2) + "\n")
    return path
