"""The `sdperf` command: run the study, list profiles, show the environment, rebuild the report, generate images.
Heavy modules are imported by the command that needs them, so a mistyped profile is answered in under a second."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from sdperf.core import paths
from sdperf.core.errors import ConfigError, short
from sdperf.config.profiles import AUTO, PROFILE_ENV, available_profiles, load_profile
from sdperf.run.plan import check_sections

PROFILE_COLUMNS = ["arch", "resolution", "steps", "scheduler", "batch_sizes", "dtype", "device", "repeats", "weights"]


def _run(args) -> int:
    from sdperf.run import runner

    with _terminate_as_interrupt():
        return runner.run(args.profile, only=args.only, force=args.force, beside_survivors=args.beside_survivors,
                          beside_load=args.beside_load)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM unwinds like Ctrl-C (the notebook in flight drops its staged rows); either silences stderr at once."""
    import signal

    def interrupt(signum, frame):
        _silence_stderr()
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: keep the default
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


_REAL_STDERR: int | None = None  # a copy of fd 2 kept once stderr is silenced, for the one line main() prints


def _silence_stderr() -> None:
    """Point fd 2 at /dev/null, keeping a copy: the tracebacks of unwinding after Ctrl-C are not news. Idempotent."""
    global _REAL_STDERR
    if _REAL_STDERR is not None:
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    _REAL_STDERR = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _say_interrupted() -> None:
    """The one line an interrupted command prints, on a line of its own (after a half-drawn progress bar)."""
    _silence_stderr()
    os.write(_REAL_STDERR, b"\nsdperf: interrupted\n")


def _auto_line() -> str:
    """Say why 'auto' picks what it picks here, so a surprise is explained rather than discovered."""
    from sdperf.config.profiles import gpu_available, resolve_name

    if os.environ.get(PROFILE_ENV):
        why = f"${PROFILE_ENV} is set"
    else:
        why = "a CUDA GPU is visible" if gpu_available() else "no CUDA GPU is visible"
    name = resolve_name(AUTO)
    missing = "" if name in available_profiles() else f" (but params/{name}.yml does not exist)"
    return f"'{AUTO}' resolves to {name!r} here: {why}{missing}"


def _profile_row(name: str) -> dict:
    try:
        profile = load_profile(name, check_runtime=False)
        check_sections(profile)
        summary = profile.summary()
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
    from sdperf.core import environment
    from sdperf.optimizations import catalog

    profile = load_profile(args.profile, check_runtime=False)
    print(json.dumps(environment.record(profile.name, profile.device, catalog.packages()), indent=2))
    return 0


def _doctor(args) -> int:
    """The profile is validated without its device probe, so a GPU profile can be examined on any machine."""
    from sdperf.measure import doctor

    profile = load_profile(args.profile, check_runtime=False)
    if args.record:
        paths.require_writable(paths.profile_reports(profile.name), "sdperf doctor --record")
    found = doctor.record(profile)
    print(doctor.report(profile, found))
    if args.record:
        print(f"recorded: {doctor.write_record(found)}")
    return 0


def _report(args) -> int:
    from sdperf.report import report

    profile = load_profile(args.profile, check_runtime=False)
    paths.require_writable(paths.profile_reports(profile.name), "sdperf report")
    print(report.write_index(profile.name))
    return 0


def _answer(args) -> int:
    from sdperf.report import answer
    from sdperf.report.report import one_machine
    from sdperf.store.results import read_results

    profile = load_profile(args.profile, check_runtime=False)
    results, _ = one_machine(read_results(profile.name))
    if args.readme is None:
        print(answer.markdown(results))
        return 0
    from pathlib import Path
    from sdperf.store.results import atomic_write_text

    path = Path(args.readme)
    if not path.is_file():
        raise ConfigError(f"--readme {short(args.readme)} is not a file; give the README whose answer block to rewrite")
    try:
        atomic_write_text(path, answer.replace_block(path.read_text(), results))
    except answer.MissingBlock as exc:
        raise ConfigError(f"--readme {short(args.readme)}: {exc}") from None
    print(f"{path}: answer block written from reports/{profile.name}")
    return 0


def _check_report(args) -> int:
    """Exit 0 when the page passes, 1 with every problem listed, 3 (not 1) when no browser is here to check it."""
    from sdperf.report import report_check

    profile = load_profile(args.profile, check_runtime=False)
    try:
        result = report_check.check_report(profile.name, args.screenshot, args.width)
    except report_check.BrowserMissing as exc:
        print(f"sdperf check-report: cannot check, {exc}", file=sys.stderr)
        return report_check.EXIT_NO_BROWSER
    print(report_check.summary(result))
    return 0 if result.ok else report_check.EXIT_PROBLEMS


def _check_lock(args) -> int:
    """Exit 0 when every pin has an installable file for the target, 1 naming those without, 3 if only unreachable."""
    from sdperf.tooling import lock_check
    from sdperf.tooling.locks import read_lock

    glibc = _glibc(args.glibc)
    lock = read_lock(args.lock)
    results = lock_check.check_lock(lock, glibc=glibc)
    print(lock_check.summary(lock, results, glibc=glibc))
    return lock_check.exit_code(results)


def _glibc(text: str) -> tuple[int, int]:
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()) or int(major) != 2 or int(minor) < 5:
        raise ConfigError(f"--glibc {text!r} is not valid; choose a glibc version 2.5 or later, e.g. 2.28")
    return int(major), int(minor)


def _generate(args) -> int:
    """Validate everything first (profile, prompts file, guidance, seeds, out dir), then generate this rank's share."""
    from sdperf.model import prompts

    load_profile(args.profile, check_runtime=False)  # a bad name or prompts file fails before torch is imported
    captions = prompts.load_captions(args.prompts)
    if args.num_prompts is not None:
        captions = prompts.select(captions, args.num_prompts, args.selection_seed)
    seeds = None if args.seeds is None else [_int("seed", s) for s in args.seeds]
    from sdperf.imagegen import generate_folder

    summary = generate_folder(load_profile(args.profile), captions, args.out, guidance_scales=args.guidance,
                              seeds=seeds, progress=not args.no_progress, batch_size=args.batch_size,
                              dtype=args.dtype, steps=args.steps)
    if summary.reports_here:
        print(summary)
    return 0


def _train_reference(args) -> int:
    from sdperf.refmodel import train_command

    return train_command.main(seed=args.seed, out=args.out, quick=args.quick, show=not args.no_progress, force=args.force)


def _train_student(args) -> int:
    from sdperf.refmodel import student_command

    return student_command.main(args.kind, seed=args.seed, out=args.out, quick=args.quick, show=not args.no_progress,
                                force=args.force, teacher=args.teacher)


def _int(what: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{what} {short(text)} is not valid; choose integers from 0 to 2**63-1") from None


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
    run.add_argument("--beside-survivors", action="store_true",
                     help="measure even though workers a killed run left behind still run (named at the start); "
                     "their memory and cores bias every figure, so the run refuses by default")
    run.add_argument("--beside-load", action="store_true",
                     help="start even though other processes keep the CPUs busy (named at the start); every worker "
                     "still measures its own window, is measured again when reached, and its rows are marked")
    add("profiles", _profiles, "list the profiles and what 'auto' picks here", profile=False)
    add("env", _env, "print the environment record stored beside every number")
    doc = add("doctor", _doctor, "every rung of the catalog with 'will run' or the reason it won't, on this machine "
              "for the profile; no model is built")
    doc.add_argument("--record", action="store_true", help="also write reports/<profile>/doctor.json, shown at the "
                     "top of the report (sdperf run records it itself)")
    add("report", _report, "rebuild reports/<profile>/index.html from what is on disk")
    ans = add("answer", _answer, "print the study's answer table from reports/<profile>/results.csv (the README's)")
    ans.add_argument("--readme", metavar="FILE", help="rewrite FILE's answer block from it instead of printing")
    check = add("check-report", _check_report, "open reports/<profile>/index.html in headless Chromium and fail on "
                "images that do not load, tables wider than the page, figures without a caption")
    check.add_argument("--screenshot", metavar="PNG", help="where to write the full-page screenshot "
                       "(default: a new temp folder; the path is printed)")
    check.add_argument("--width", type=int, default=1280, metavar="PX", help="viewport width (default 1280)")
    lck = add("check-lock", _check_lock, "ask the package indexes whether every pin of a lock has a wheel for "
              "Linux x86_64 CPython 3.11, without installing anything", profile=False)
    lck.add_argument("lock", help="the lock file, e.g. requirements-gpu.lock")
    lck.add_argument("--glibc", default="2.28", metavar="2.N", help="the oldest glibc to install on (default 2.28, "
                     "torch's own manylinux_2_28)")
    gen = add("generate", _generate, "generate one image per (prompt id, guidance, seed) into a folder, resumably; "
              "under torchrun each rank makes its share")
    gen.add_argument("--prompts", required=True, metavar="FILE",
                     help="captions: COCO annotations .json, MLPerf .tsv (id, caption) or .txt (one per line)")
    gen.add_argument("--out", required=True, metavar="DIR", help="folder for the images, manifest.csv, summary.json")
    gen.add_argument("--guidance", nargs="+", metavar="G", help="guidance scales (default: the profile's); "
                     "NeMo's curve: 1.5 2 3 4 5 6 7 8")
    gen.add_argument("--seeds", nargs="+", metavar="S", help="latent seeds given to every prompt, one image each "
                     "(default: prompt i gets the profile's seed + i)")
    gen.add_argument("--num-prompts", type=int, metavar="N", help="a random selection of N captions (NeMo: 30000, "
                     "MLPerf: 5000); default all")
    gen.add_argument("--selection-seed", type=int, default=0, metavar="S", help="seed of that selection (default 0)")
    gen.add_argument("--batch-size", type=int, default=1, metavar="B",
                     help="prompts per batch, within one guidance scale (default 1)")
    gen.add_argument("--steps", type=int, metavar="N", help="denoising steps (default: the profile's; NeMo: 50)")
    gen.add_argument("--dtype", help="pipeline precision (default: the profile's dtype)")
    gen.add_argument("--no-progress", action="store_true", help="no progress bars")
    ref = add("train-reference", _train_reference, "train the study's reference text-to-image model and its "
              "evaluator into models/reference/ (about 45 minutes on 2 cores; run again to resume after a kill)",
              profile=False)
    ref.add_argument("--seed", type=int, default=0, help="seed of every stage (default 0, the committed model)")
    ref.add_argument("--out", metavar="DIR", help="output folder (default models/reference; with --quick "
                     "models/.reference-quick, never the committed model)")
    ref.add_argument("--quick", action="store_true", help="a few steps of every stage: checks the code, not a model")
    ref.add_argument("--force", action="store_true", help="replace a model in --out that another recipe made "
                     "(refused without it)")
    ref.add_argument("--no-progress", action="store_true", help="no progress bars")
    from sdperf.refmodel.student_recipe import KINDS

    stu = add("train-student", _train_student, "distil a student of the reference model into models/<kind>/: a "
              "latent consistency student, a guidance-distilled student or a tiny decoder (about 30 minutes each "
              "on 2 cores; run again to resume after a kill)", profile=False)
    stu.add_argument("kind", choices=KINDS, help="what to distil")
    stu.add_argument("--seed", type=int, default=0, help="seed of the data and the training (default 0)")
    stu.add_argument("--out", metavar="DIR", help="output folder (default models/<kind>; with --quick "
                     "models/.<kind>-quick, never the committed student)")
    stu.add_argument("--teacher", metavar="DIR", help="the reference model to distil (default models/reference)")
    stu.add_argument("--quick", action="store_true", help="a few steps: checks the code, not a model")
    stu.add_argument("--force", action="store_true", help="replace a student in --out that another recipe made")
    stu.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        paths.resolve_env()  # relative or empty SDPERF_*_DIR: made absolute (or refused) before anything runs
        return args.func(args)
    except ConfigError as exc:
        print(f"sdperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _say_interrupted()
        return 130


if __name__ == "__main__":
    sys.exit(main())
