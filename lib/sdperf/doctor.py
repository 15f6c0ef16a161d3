"""`sdperf doctor`: before a user spends GPU (or CPU) hours, every rung of the catalog with "will run" or the exact
reason it won't, for this machine and a chosen profile, in seconds and without building a model.

The reasons are the techniques' own availability checks (sdperf.optimizations.catalog), the ones the workers ask
before applying a technique, so the doctor and the study never disagree. The profile's own checks (memory for its
resolution and batch, matmul size) ran when it was loaded; its device is checked here and reported, not raised, so
a GPU profile can be examined on a machine without a GPU.
"""
from __future__ import annotations

import os

from sdperf.errors import ConfigError
from sdperf.profiles import Profile, check_device

WILL_RUN, WONT_RUN = "will run", "won't run"


def machine_lines(profile: Profile) -> list[str]:
    from sdperf import environment

    isa = environment.cpu_isa()
    have = ", ".join(f for f, on in isa.items() if on) or "none of those checked"
    lacking = ", ".join(f for f, on in isa.items() if not on) or "none"
    lines = [f"CPU: {environment.cpu_model()} (family/model/stepping {environment.family_model_stepping()}), "
             f"{environment.physical_cores()} cores, {os.cpu_count()} logical CPUs, {environment.memory_gib()} GiB",
             f"ISA present: {have}; absent: {lacking}"]
    try:
        check_device(profile.name, profile.device, profile.dtype)
        lines.append(f"profile {profile.name!r}: device {profile.device} with {profile.dtype}: available")
    except ConfigError as exc:
        lines.append(f"profile {profile.name!r}: {exc}")
    return lines


def rungs(profile: Profile) -> list[dict]:
    """One row per catalog key: its family, notebook, verdict and reason."""
    from sdperf.optimizations import catalog

    ctx = catalog.Context(profile)
    out = []
    for key in catalog.keys():
        tech = catalog.get(key)
        try:
            ok, reason = tech.availability(ctx)
        except Exception as exc:  # noqa: BLE001 - a check that cannot even run is a reason the rung won't
            ok, reason = False, f"its availability check failed: {type(exc).__name__}: {exc}"
        out.append({"rung": key, "family": tech.family, "notebook": tech.notebook,
                    "verdict": WILL_RUN if ok else WONT_RUN, "reason": reason})
    return out


def report(profile: Profile) -> str:
    import pandas as pd

    table = pd.DataFrame(rungs(profile))
    counts = table["verdict"].value_counts()
    head = machine_lines(profile) + [f"{counts.get(WILL_RUN, 0)} of {len(table)} rungs will run here; "
                                     f"{counts.get(WONT_RUN, 0)} won't, each with its reason:"]
    with pd.option_context("display.max_colwidth", 160, "display.width", 250):
        return "\n".join(head) + "\n" + table.to_string(index=False)
