"""The `sdperf` command: run the study, list profiles, show the environment, rebuild the report.

Heavy modules (torch, papermill, pandas) are imported by the command that needs them, so a mistyped profile
is answered in well under a second.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from sdperf.errors import ConfigError
from sdperf.profiles import AUTO, PROFILE_ENV, available_profiles, load_profile

PROFILE_COLUMNS = ["arch", "resolution", "steps", "scheduler", "batch_sizes", "dtype", "device", "repeats",
                   "weights"]


def _run(args) -> int:
    from sdperf import runner

    return runner.run(args.profile, only=args.only, force=args.force)


def _auto_line() -> str:
    """Say why 'auto' picks what it picks here, so a surprise is explained rather than discovered."""
    from sdperf.profiles import gpu_available, resolve_name

    if os.environ.get(PROFILE_ENV):
        why = f"${PROFILE_ENV} is set"
    else:
        why = "a CUDA GPU is visible" if gpu_available() else "no CUDA GPU is visible"
    name = resolve_name(AUTO)
    missing = "" if name in available_profiles() else f" (but params/{name}.yml does not exist)"
    return f"'{AUTO}' resolves to {name!r} here: {why}{missing}"


def _profile_row(name: str) -> dict:
    try:
        summary = load_profile(name, check_runtime=False).summary()
    except ConfigError as exc:  # one broken file should not hide the others
        return {"name": name, "error": str(exc)}
    row = {"name": name, **{k: summary[k] for k in PROFILE_COLUMNS}}
    row["weights"] = row["weights"] or "random init"
    return row


def _profiles(args) -> int:
    import pandas as pd

    table = pd.DataFrame([_profile_row(n) for n in available_profiles()])
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_colwidth", 80):
        print(table.fillna("").to_string(index=False) if len(table) else "no profiles in params/")
    print(_auto_line())
    return 0


def _env(args) -> int:
    from sdperf import environment

    profile = load_profile(args.profile, check_runtime=False)
    print(json.dumps(environment.record(profile.name, profile.device), indent=2))
    return 0


def _report(args) -> int:
    from sdperf import report

    profile = load_profile(args.profile, check_runtime=False)
    print(report.write_index(profile.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sdperf", description="Stable Diffusion inference speed study.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help_: str, profile: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        if profile:
            p.add_argument("--profile", default=AUTO,
                           help=f"profile in params/ (default: {AUTO}: ${PROFILE_ENV}, else by GPU)")
        p.set_defaults(func=func)
        return p

    run = add("run", _run, "execute the study notebooks and write reports/<profile>/")
    run.add_argument("--only", nargs="+", action="extend", metavar="NAME",
                     help="notebooks to run: full name (00_baseline), number (00) or topic (baseline)")
    run.add_argument("--force", action="store_true", help="rerun notebooks already run for this commit")
    add("profiles", _profiles, "list the profiles and what 'auto' picks here", profile=False)
    add("env", _env, "print the environment record stored beside every number")
    add("report", _report, "rebuild reports/<profile>/index.html from what is on disk")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"sdperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sdperf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
