"""A run's stand-alone comparisons measured up front, in one schedule, before its notebooks read them.

Rather than each notebook's rounds bracketing themselves with fp32 baselines of their own, `sdperf run` measures every
key they compare at batch 1 in ONE rounds.run call into the run's ledger (sdperf.measure.ledger); they read it back.
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

EVERY = 13  # configurations between two baselines inside a round
OWN_PROCESSES = "own_processes"  # 09 times this many schedulers in processes of their own
COMPILE_NOTEBOOK, PRECISION_NOTEBOOK, LADDER_NOTEBOOK = "04_torch_compile", "01_half_precision", "10_ladder"
STEPS_NOTEBOOK, DEEPSPEED_NOTEBOOK = "09_fewer_steps", "06_deepspeed"
ENGINE_NOTEBOOK = "07_engine_export"


def parameters(name: str, profile: Profile, notebooks_dir: Path | None = None) -> dict:
    """The parameters notebook `name` will run with: its defaults, then what the runner injects."""
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
    """10's search parts less the half precisions its search would skip (sdperf.measure.half_budget.skips)."""
    from sdperf.measure import half_budget

    single = [k for k in keys if len(catalog.split(k)) == 1]  # a stack listed here is the notebook's error to report
    skipped = half_budget.skips(_study(profile), single, say=lambda _: None)
    _trim_heap()  # cheap when no probe built a pipeline
    return [k for k in keys if k not in skipped]


def _half_precisions(profile: Profile, keys: list[str]) -> list[str]:
    """01's precisions among `keys` that run here and fit the budget (sdperf.measure.half_budget)."""
    from sdperf.measure import half_budget

    study = _study(profile)
    ctx, out = Context(profile), []
    for key in catalog.among(keys, PRECISION_NOTEBOOK, (catalog.PRECISION,)):
        t = catalog.get(key)
        if not t.availability(ctx)[0]:
            continue
        probe = half_budget.probe(study, t.dtype)
        if probe.skip_reason(profile.warmup + profile.repeats, profile.variant_budget_s, "") is None:
            out.append(key)
    _trim_heap()
    return out


def keys_of(name: str, params: dict, profile: Profile) -> list[str]:
    """The valid catalog keys notebook `name` compares stand-alone at batch 1 when run with `params`."""
    from sdperf.select.stack_search import STAGE_FAMILIES, UNET_FAMILIES, unet_side

    def valid(key):
        try:
            Stack.of(key)
        except (ConfigError, ValueError, KeyError):
            return False
        return True

    keys = [k for k in profile.techniques if valid(k)]  # a bad key is the notebook's own error to report

    def among(notebook, *families):
        return catalog.among(keys, notebook, families)

    if name == PRECISION_NOTEBOOK:
        wanted = _half_precisions(profile, keys)
    elif name == DEEPSPEED_NOTEBOOK:
        wanted = catalog.keys(notebook=name)  # 06 probes every DeepSpeed key the catalog declares
    elif name == STEPS_NOTEBOOK:
        wanted = among(name, catalog.SCHEDULER)[:int(params.get(OWN_PROCESSES) or 1)] + among(name, catalog.CACHING) \
            + among(name, catalog.DISTILLED, catalog.DECODER, catalog.GUIDANCE)
    elif name == LADDER_NOTEBOOK:
        wanted = [k for k in among(None, *UNET_FAMILIES) if unet_side(k)] + among(None, *STAGE_FAMILIES) \
            + among(None, catalog.ALLOCATOR)
        if params.get("check_method", True):
            wanted += catalog.keys(notebook=name, family=catalog.CALIBRATION)
    else:
        wanted = among(name)
    out = [Stack.of(k).key for k in wanted]  # every key is valid here: the profile's were filtered, the catalog's are
    return _search_parts(profile, out) if name == LADDER_NOTEBOOK else out


def plan(profile: Profile, notebooks: list[str], notebooks_dir: Path | None = None,
         owners: dict[str, list[rounds.Config]] | None = None) -> list[rounds.Config]:
    """One configuration per distinct stack the selected notebooks compare, in study order (`owners`: by_notebook's)."""
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
    """07's best lossless engine at each batch size that fits its budget, chosen from the batch-1 rounds `measured`."""
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
    """The workers the batch-1 rounds up front still launch (07's sweep not counted). `owners`: as for plan."""
    configs = plan(profile, notebooks, notebooks_dir, owners)
    if not configs:
        return 0
    return rounds.pending(profile, configs, ledger=_ledger(profile), every=EVERY)


def run(profile: Profile, notebooks: list[str], notebooks_dir: Path | None = None,
        say: Callable[[str], None] = print, launcher: Callable | None = None,
        owners: dict[str, list[rounds.Config]] | None = None) -> float:
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
