"""A run's stand-alone comparisons measured up front, in one schedule, before its notebooks read them.

Each comparing notebook (01-10) asks sdperf.measure.rounds for its configurations, and each such call brackets its rounds
with fp32 baseline processes of its own: nine comparisons paid ~28 baseline processes (~10 min on cpu) and a fork
server each. `sdperf run` knows which notebooks will run and, from their parameters (the profile's `notebooks:`
section over each notebook's defaults), which catalog keys each compares stand-alone at batch 1. It measures them
all in ONE rounds.run call into the run's ledger (sdperf.measure.ledger): every round holds every configuration once, in
turn, the twin among them, and a baseline follows every `EVERY` configurations, so none is timed further than
that from a baseline on either side. When a notebook then asks, rounds.run finds its configurations in the ledger
and reads them back: the same workers, rounds, interpolated baseline and noise floor, with fewer baselines.

07's batch sweep (its best lossless engine at its larger batch sizes, sdperf.select.engine_sweep) follows, decided from
the same batch-1 rounds as 07 will decide it: one schedule per batch size, whose fp32 processes 00 then describes
as well. What a notebook decides only while it runs (the ladder's stacks, chosen from the others' results) it still
measures itself, and a notebook run alone (papermill, JupyterLab) measures everything itself, as before.
"""
from __future__ import annotations

import contextlib
import ctypes
import time
from pathlib import Path
from typing import Callable

from sdperf.core import paths
from sdperf.measure import ledger as ledgers, rounds
from sdperf.core.errors import ConfigError
from sdperf.optimizations import artefacts, catalog
from sdperf.optimizations.catalog import Context, Stack
from sdperf.core.paths import scratch_dir
from sdperf.config.profiles import Profile
from sdperf.run.plan import notebook_parameters

EVERY = 13  # configurations between two baselines inside a round (~2.7 min of processes on cpu; cpu's 23 configurations
#            and the twin make 24, two chunks of 12 as with 12; 13 leaves room for one more without a third chunk)
# 09 times its first `own_processes` schedulers in processes of their own and prices the rest from the baseline's
# workers; 10's allocator rung (fp32 eager under each allocator) forks its workers from a server started under their
# allocator (sdperf.measure.allocator_servers), and so do the other workers of a schedule holding one, so the rung
# shares the schedule's baselines instead of paying its own.
OWN_PROCESSES = "own_processes"
COMPILE_NOTEBOOK, PRECISION_NOTEBOOK, LADDER_NOTEBOOK = "04_torch_compile", "01_half_precision", "10_ladder"
STEPS_NOTEBOOK, DEEPSPEED_NOTEBOOK = "09_fewer_steps", "06_deepspeed"
ENGINE_NOTEBOOK = "07_engine_export"


def parameters(name: str, profile: Profile, notebooks_dir: Path | None = None) -> dict:
    """The parameters notebook `name` will run with: its defaults, then what the runner injects (the profile's
    notebooks: section, sdperf.run.plan.notebook_parameters)."""
    import ast

    import papermill

    path = Path(notebooks_dir or paths.notebooks_dir()) / f"{name}.ipynb"
    declared = papermill.inspect_notebook(str(path))
    out = {}
    for key, spec in declared.items():
        try:
            out[key] = ast.literal_eval(spec["default"])
        except (ValueError, SyntaxError):  # not a literal: the notebook's own business
            continue
    return {**out, **notebook_parameters(profile, name)}


def _study(profile: Profile):
    """A recorder-less handle for the probes asked before the notebooks (they read its answers back)."""
    from sdperf.core import environment as env
    from sdperf.measure.study import Study

    return Study(notebook="prefetch", profile=profile, env=env.record(profile.name, profile.device, catalog.packages()),
                 recorder=None)


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):  # the probe's pipeline is freed: give its heap back to the
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # system before this process waits out hours of notebooks


def _search_parts(profile: Profile, keys: list[str]) -> list[str]:
    """10's search parts less the half precisions its search would skip (sdperf.measure.half_budget.skips, the rule
    recipe.run applies to the same keys): a part the search leaves out is not worth rounds up front. Only a
    precision among them is probed: without one, no pipeline is built."""
    from sdperf.measure import half_budget

    single = [k for k in keys if len(catalog.split(k)) == 1]  # a stack listed here is the notebook's error to report
    skipped = half_budget.skips(_study(profile), single, say=lambda _: None)
    _trim_heap()  # cheap when no probe built a pipeline
    return [k for k in keys if k not in skipped]


def _half_precisions(profile: Profile) -> list[str]:
    """01's precisions that run here and fit the budget (sdperf.measure.half_budget: the probe 01 then reads back)."""
    from sdperf.measure import half_budget

    study = _study(profile)
    ctx, out = Context(profile), []
    for key in catalog.among(profile.techniques, PRECISION_NOTEBOOK, (catalog.PRECISION,)):
        t = catalog.get(key)
        if not t.availability(ctx)[0]:
            continue
        probe = half_budget.probe(study, t.dtype)
        if probe.skip_reason(profile.warmup + profile.repeats, profile.variant_budget_s, "") is None:
            out.append(key)
    _trim_heap()
    return out


def keys_of(name: str, params: dict, profile: Profile) -> list[str]:
    """The catalog keys notebook `name` compares stand-alone at batch 1 when run with `params`: the profile's
    techniques it owns (sdperf.optimizations.catalog.among), whatever its parameters are called; 10 also reads the
    parts of its search. Valid keys only: a bad one is the notebook's own error to report."""
    from sdperf.select.stack_search import UNET_FAMILIES

    def valid(key):
        try:
            return bool(Stack.of(key))
        except (ConfigError, ValueError, KeyError):
            return False

    keys = [k for k in profile.techniques if valid(k)]

    def among(notebook, *families):
        return catalog.among(keys, notebook, families)

    if name == PRECISION_NOTEBOOK:
        wanted = _half_precisions(profile)
    elif name == DEEPSPEED_NOTEBOOK:
        wanted = catalog.keys(notebook=name)  # 06 probes every DeepSpeed key the catalog declares
    elif name == STEPS_NOTEBOOK:
        wanted = among(name, catalog.SCHEDULER)[:int(params.get(OWN_PROCESSES) or 1)] + among(name, catalog.CACHING)
    elif name == LADDER_NOTEBOOK:
        wanted = among(None, *UNET_FAMILIES) + among(None, catalog.STAGES) + among(None, catalog.ALLOCATOR)
        if params.get("check_method", True):
            wanted += catalog.keys(notebook=name, family=catalog.CALIBRATION)
    else:
        wanted = among(name)
    out = []
    for key in wanted:
        try:
            out.append(Stack.of(key).key)
        except (ConfigError, ValueError, KeyError):
            continue
    return _search_parts(profile, out) if name == LADDER_NOTEBOOK else out


def plan(profile: Profile, notebooks: list[str], notebooks_dir: Path | None = None,
         owners: dict[str, list[rounds.Config]] | None = None) -> list[rounds.Config]:
    """One configuration per distinct stack the selected notebooks compare, in study order. `owners`: by_notebook's
    result when the caller made it already (sdperf.run.runner plans once, for the expected time and the run)."""
    if owners is None:
        owners = by_notebook(profile, notebooks, notebooks_dir)
    return [c for cs in owners.values() for c in cs]


def by_notebook(profile: Profile, notebooks: list[str],
                notebooks_dir: Path | None = None) -> dict[str, list[rounds.Config]]:
    """The configurations each selected notebook adds (a stack asked twice counts for the first notebook)."""
    seen, out = set(), {}
    for name in notebooks:
        for key in keys_of(name, parameters(name, profile, notebooks_dir), profile):
            if key not in seen and (Stack.of(key).allocator == "default" or name == LADDER_NOTEBOOK):
                seen.add(key)
                out.setdefault(name, []).append(rounds.Config.of(key))
    return out


def sweep(profile: Profile, notebooks: list[str], measured: rounds.Measured, configs: list[rounds.Config],
          notebooks_dir: Path | None = None) -> list[rounds.Config]:
    """07's batch sweep beyond batch 1: its best lossless engine at each of its batch sizes that fits its budget,
    chosen from the batch-1 rounds `measured` by the rule 07 applies to the same rounds (sdperf.select.engine_sweep)."""
    from sdperf.select import engine_sweep
    from sdperf.measure.comparison import Comparison

    if ENGINE_NOTEBOOK not in notebooks:
        return []
    params = parameters(ENGINE_NOTEBOOK, profile, notebooks_dir)
    cmp = Comparison.of(measured, configs)
    best = engine_sweep.best_engine(cmp, keys_of(ENGINE_NOTEBOOK, params, profile))
    if best is None:
        return []
    sizes = engine_sweep.within_budget(profile, cmp, best, list(params.get("sweep_batch_sizes") or []),
                                       float(params.get("sweep_budget_s", float("inf"))))
    return [rounds.Config.of(best, None, b) for b in sizes]


def _ledger(profile: Profile) -> Path:
    return scratch_dir(profile.name) / "rounds" / ledgers.name(ledgers.run_key(), profile.name,
                                                              getattr(profile, "rounds", rounds.MIN_ROUNDS), None)


def pending(profile: Profile, notebooks: list[str], notebooks_dir: Path | None = None,
            owners: dict[str, list[rounds.Config]] | None = None) -> int:
    """The workers the batch-1 rounds up front still launch (a resumed run: only its missing rounds'); 07's
    batch sweep, decided from those rounds, is not counted. `owners`: as for plan."""
    configs = plan(profile, notebooks, notebooks_dir, owners)
    if not configs:
        return 0
    return rounds.pending(profile, configs, ledger=_ledger(profile), every=EVERY)


def run(profile: Profile, notebooks: list[str], notebooks_dir: Path | None = None,
        say: Callable[[str], None] = print, launcher: Callable | None = None,
        owners: dict[str, list[rounds.Config]] | None = None) -> float:
    """Measure the selected notebooks' stand-alone configurations into the run's ledger; the seconds it took.
    `launcher` replaces the worker launch (the tests' simulated machine); `owners`: as for plan."""
    started = time.time()
    if owners is None:
        owners = by_notebook(profile, notebooks, notebooks_dir)
    configs = plan(profile, notebooks, notebooks_dir, owners)
    if not configs:
        return 0.0
    scratch = scratch_dir(profile.name)
    if COMPILE_NOTEBOOK in notebooks and parameters(COMPILE_NOTEBOOK, profile, notebooks_dir).get("cold_cache", True):
        from sdperf.optimizations.torch_compile import clear_inductor

        clear_inductor(scratch)  # 04's round 0 compiles cold (its cold_cache)
    n_rounds = getattr(profile, "rounds", rounds.MIN_ROUNDS)
    shared = _ledger(profile)
    engines, cross_run = artefacts.root_for(scratch, "prefetch")
    say(f"stand-alone rounds up front for {', '.join(owners)}: {len(configs)} configurations, {n_rounds} rounds, "
        f"a baseline after every {EVERY}")
    try:
        m = rounds.run(profile, configs, rounds=n_rounds, scratch=scratch, say=say, artefacts=engines,
                       ledger=shared, every=EVERY, launcher=launcher)
        for c in sweep(profile, notebooks, m, configs, notebooks_dir):
            say(f"07's batch sweep up front: {c.stack} at batch {c.batch_size}, {n_rounds} rounds")
            rounds.run(profile, [c], rounds=n_rounds, scratch=scratch, say=say, artefacts=engines, ledger=shared,
                       every=EVERY, launcher=launcher)
    finally:
        artefacts.release(engines, cross_run)
    return time.time() - started
