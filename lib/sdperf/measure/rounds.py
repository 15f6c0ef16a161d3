"""Every speed ratio of the study, by one method: each configuration in a fresh process, in rounds, against the
fp32 eager baseline, with the fp32-vs-fp32 noise floor measured the same way.

Two pipelines in one process share an allocator, a page cache and the cores, so every configuration runs in a worker
of its own. Each round is opened and closed by an fp32 eager baseline (B c1 c2 .. twin B c2 .. twin c1 B ...), and a
ratio divides the baseline interpolated to the moment the configuration was timed, so steady drift moves both alike.
The twin gives the noise floor: "faster" only when the whole range over rounds lies above the noise band, "slower"
below, else "within noise". A ratio is its median over rounds with the min-max range (RATIOS).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pandas as pd

from sdperf.core import environment
from sdperf.measure import allocator_servers, contention, drift, lifeline, memory, worker
from sdperf.measure import ledger as ledgers
from sdperf.optimizations import allocator as allocators
from sdperf.optimizations.catalog import BASELINE_KEY, Context, Stack
from sdperf.store import results

BASELINE, TWIN = "fp32 eager", "fp32 eager (twin)"
MIN_ROUNDS = 3
# The ratios every configuration gets: (result field, ratio name, what it stands for)
RATIOS = (("latency_s", "speedup", "per image at the profile's steps"),
          ("unet_step_s", "unet_step_speedup", "per UNet step"),
          ("s_per_image_seed", "seed_speedup", "per image at 50 PLMS steps (composed from the measured stages)"))
FASTER, SLOWER, NOISE = results.FASTER, results.SLOWER, results.NOISE  # the verdict column's words
REUSE_BASELINE_S = 600  # a comparison may open on the run's last baseline when it closed less than this ago
# Re-measures, once the machine is quiet, of a worker others' load reached (sdperf.measure.contention); one still
# reached is kept and the rows of every ratio it enters are marked
BESIDE_LOAD_RETRIES = 1
# Imported once by the fork server (nothing is built there); diffusers and transformers load model modules lazily,
# so they are named. forkserver_lifeline comes first: the server dies with its launcher before it imports the rest.
PRELOAD = ["sdperf.measure.forkserver_lifeline", "sdperf.measure.worker", "sdperf.measure.measurements",
           "sdperf.model.pipelines", "sdperf.optimizations.catalog", "diffusers.models.unets.unet_2d_condition",
           "diffusers.models.autoencoders.autoencoder_kl",
           "diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion", "transformers.models.clip.modeling_clip",
           "transformers.models.clip.tokenization_clip"]


def method(rounds: int, sittings: int = 1) -> str:
    """The method every compared ratio names, saying when a killed run's rounds came from several sittings."""
    resumed = f"; rounds from {sittings} sittings (a killed run resumed, each round whole)" if sittings > 1 else ""
    return (f"fresh process per configuration, {rounds} rounds in turn; ratio per round against the fp32 eager "
            f"baseline interpolated to the configuration's time; median [min-max] over rounds{resumed}")


@dataclass(frozen=True)
class Config:
    """One configuration to compare: a display name unique in its run, and the catalog stack it runs."""

    name: str
    stack: str = BASELINE_KEY
    batch_size: int = 1

    @classmethod
    def of(cls, stack: str, name: str | None = None, batch_size: int = 1) -> "Config":
        return cls(name or Stack.of(stack).key, Stack.of(stack).key, batch_size)


def _batch_size(configs: list[Config]) -> int:
    batches = {c.batch_size for c in configs} or {1}
    if len(batches) > 1:
        raise ValueError(f"one run compares one batch size against its baseline; got {sorted(batches)}")
    return batches.pop()


def schedule(configs: list[Config], rounds: int, *, twin: bool = True, every: int | None = None,
             done: dict[str, set[int]] | None = None) -> list[tuple[int, Config]]:
    """(round, config) in running order: each round's configurations (twin included, rotated) between baselines,
    with `every`, one also after each `every` of them; `done`: the rounds each configuration already has."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if every is not None and every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    done = done or {}
    b = _batch_size(configs)
    base, others = Config(BASELINE, batch_size=b), list(configs) + ([Config(TWIN, batch_size=b)] if twin else [])
    seq = []
    for r in range(rounds):
        k = r % max(len(others), 1)
        order = [c for c in others[k:] + others[:k] if r not in done.get(c.name, ())]
        if others and not order:
            continue
        if not seq:
            seq.append((r, base))
        step = every or max(len(order), 1)
        for i in range(0, len(order), step):
            last = i + step >= len(order)
            seq += [(r, c) for c in order[i:i + step]] + [(r + 1 if last else r, base)]
        if not order:
            seq.append((r + 1, base))
    return seq


def closing(plan: list[tuple[int, Config]]) -> dict[int, int]:
    """{index in `plan` of the baseline that closes a round: that round}: after it, the round is whole."""
    if all(c.name == BASELINE for _, c in plan):  # the baseline alone (nothing applicable): one per round
        return {i: r for i, (r, _) in enumerate(plan)}
    out, last_round = {}, None
    for i, (r, c) in enumerate(plan):
        if c.name != BASELINE:
            last_round = r
        elif last_round is not None and r == last_round + 1:
            out[i], last_round = last_round, None
    return out


# ---------------------------------------------------------------- launching workers

def _fork_context():
    """The fork server context; its server dies with this process (forkserver_lifeline reads our pid from it)."""
    os.environ[lifeline.LAUNCHER_ENV] = str(os.getpid())
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def death_note(code: int, err: str = "", pid: int | None = None, oom_before: int | None = None) -> str:
    """Why a worker left no result (lifeline.death_cause: its signal, and memory where the system says so)."""
    return f"worker died ({lifeline.death_cause(code, pid, oom_before)}) {err}".strip()


def too_big(profile, config: Config) -> str | None:
    """Why `config` cannot be launched now for memory (estimate and room named; sdperf.measure.memory), or None."""
    fits, why = memory.preflight(profile, config.stack, config.batch_size)
    return None if fits else why


def _run_forked(spec: dict, out: Path, timeout_s: float | None,
                setting: str | None = None) -> tuple[int | None, int]:
    """A worker forked from the fork server or allocator `setting`'s; (exit code or None on timeout, pid)."""
    if setting is None:
        proc = _fork_context().Process(target=worker.run_to, args=(spec, out))
    else:
        env = {**allocators.environment(setting), lifeline.LAUNCHER_ENV: str(os.getpid())}
        allocator_servers.server(setting, env, PRELOAD)
        proc = allocator_servers.Worker(setting, target=worker.run_to, args=(spec, out))
    proc.start()
    server = None if setting is None else allocator_servers.pid(setting)
    with lifeline.registered(spec["profile"], proc.pid, spec, server_pid=server):
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
            return None, proc.pid
    return proc.exitcode, proc.pid


def launch(spec: dict, *, setting: str = "default", allocator_server: bool = False,
           timeout_s: float | None = None) -> tuple[dict, object | None]:
    """Run one worker; (its result, its output or None). One that dies or overruns is a failed result saying why."""
    spec = {**spec, "launcher_pid": os.getpid()}
    oom_before = lifeline.oom_kills()
    with tempfile.TemporaryDirectory(prefix="sdperf-worker-") as tmp:
        out = Path(tmp)
        code, pid = _run_forked(spec, out, timeout_s, setting if allocator_server else None)
        path = out / worker.RESULT
        if code is None:
            return {"status": "failed", "note": f"worker timed out after {timeout_s:.0f} s"}, None
        if not path.is_file():
            return {"status": "failed", "note": death_note(code, pid=pid, oom_before=oom_before)}, None
        result = json.loads(path.read_text())
        output = None
        if (out / worker.OUTPUT).is_file():
            import torch

            output = SimpleNamespace(**torch.load(out / worker.OUTPUT, weights_only=True))
        return result, output


# ---------------------------------------------------------------- the arithmetic of a run

def _mid(rows: pd.DataFrame) -> pd.Series:
    """The wall-clock midpoint of each worker's timed calls: where a baseline is read for it."""
    return (rows.t_start + rows.t_end) / 2


def baseline_at(raw: pd.DataFrame, column: str, t_mid) -> np.ndarray:
    """The fp32 baseline's `column` interpolated linearly in wall time to `t_mid`: how every ratio reads it."""
    base = raw[(raw.config == BASELINE) & (raw.status == "ok") & raw[column].notna()]
    base = base.assign(t_mid=_mid(base)).sort_values("t_mid")
    if base.empty:
        raise ValueError(f"no baseline worker of this run measured {column!r}")
    return np.interp(t_mid, base.t_mid, base[column])


WITH_BASELINE_DECODE = ("; a technique that changes only the denoising loop is timed without the VAE decode and "
                        "its per-image figures add the baseline's decode, interpolated likewise (composed)")


def with_baseline_decode(raw: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """Complete the figures of workers that skipped the VAE decode (loop-only stacks) with the baseline's decode."""
    if "decoded" not in raw or not (raw.decoded == False).any():  # noqa: E712 (NaN: an older record, decoded)
        return raw
    raw = raw.copy()
    part = (raw.decoded == False) & (raw.status == "ok")  # noqa: E712
    vae = baseline_at(raw, "vae_decode_s", _mid(raw[part]))
    for col in ("latency_s", "p10_s", "p90_s"):
        if col in raw:
            raw.loc[part, col] = raw.loc[part, col] + vae
    for col in ("s_per_image", "s_per_image_seed", "s_per_image_composed"):
        if col in raw:
            raw.loc[part, col] = raw.loc[part, col] + vae / batch_size
    raw.loc[part, "vae_decode_s"] = vae
    return raw


def per_round_ratios(raw: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, round): each ratio against the baseline interpolated to its timed calls."""
    ok = raw[raw.status == "ok"]
    mine = ok[ok.config != BASELINE]
    out = pd.DataFrame({"config": mine.config.to_numpy(), "round": mine["round"].to_numpy()})
    for field_, name, _ in RATIOS:
        ref = baseline_at(ok, field_, _mid(mine)) if len(mine) else np.array([])
        out[name] = ref / mine[field_].to_numpy(dtype=float)
        out[f"baseline_{field_}"] = ref
    return out[["config", "round"] + [n for _, n, _ in RATIOS] + [f"baseline_{f}" for f, _, _ in RATIOS]]


def noise_band(values) -> tuple[float, float]:
    """The fp32-vs-fp32 ratios' range, made symmetric: r and 1/r are equally likely between equal processes."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(min(v.min(), 1 / v.max())), float(max(v.max(), 1 / v.min()))


def speed_verdict(lo: float, hi: float, band: tuple[float, float]) -> str:
    """Faster only when the whole range over rounds clears the noise band; slower when it lies below it."""
    if np.isnan(band[0]) or np.isnan(lo):
        return NOISE
    if lo > band[1]:
        return FASTER
    if hi < band[0]:
        return SLOWER
    return NOISE


def summarize(raw: pd.DataFrame, ratios: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per configuration medians over rounds with min-max, set-up, memory and verdicts; and the noise bands."""
    twin = ratios[ratios.config == TWIN]
    bands = {name: noise_band(twin[name]) for _, name, _ in RATIOS}
    rows = []
    for name, g in raw.groupby("config", sort=False):
        ok = g[g.status == "ok"]
        row = {"config": name, "stack": g["stack"].iloc[0], "rounds": len(ok),
               "status": "ok" if len(ok) else g.status.iloc[0], "note": "" if len(ok) else g.note.iloc[0]}
        if len(ok):
            first, later = ok[ok["round"] == ok["round"].min()].iloc[0], ok[ok["round"] > ok["round"].min()]
            for col in ("latency_s", "s_per_image", "unet_step_s", "s_per_image_seed", "s_per_image_composed"):
                row[col], row[col + "_lo"], row[col + "_hi"] = ok[col].median(), ok[col].min(), ok[col].max()
            row.update(build_s=first.build_s, setup_s=first.setup_s, first_call_s=first.first_call_s,
                       setup_warm_s=later.setup_s.median() if len(later) else None,
                       first_call_warm_s=later.first_call_s.median() if len(later) else None,
                       peak_memory_mib=ok.peak_memory_mib.max(), process_peak_mib=ok.process_peak_mib.max(),
                       setup_peak_mib=first.setup_peak_mib, seed_unet_calls=first.seed_unet_calls,
                       iterations=first.iterations)
        mine = ratios[ratios.config == name]
        for _, ratio, _ in RATIOS:
            if name == BASELINE:
                row[ratio], row[ratio + "_lo"], row[ratio + "_hi"] = 1.0, 1.0, 1.0
                continue
            if mine.empty:
                continue
            v = mine[ratio]
            row[ratio], row[ratio + "_lo"], row[ratio + "_hi"] = v.median(), v.min(), v.max()
            row[ratio + "_verdict"] = speed_verdict(v.min(), v.max(), bands[ratio])
        rows.append(row)
    return pd.DataFrame(rows), bands


@dataclass
class Measured:
    """What one run of rounds found: worker results, per-round ratios, summary, noise bands, facts and drift."""

    rounds: int
    raw: pd.DataFrame
    ratios: pd.DataFrame
    summary: pd.DataFrame
    noise: dict
    facts: dict = field(default_factory=dict)
    drift: dict = field(default_factory=dict)
    sittings: int = 1
    beside_load: dict = field(default_factory=dict)  # {configuration: why its figures may be wrong} (beside_load)

    @property
    def method(self) -> str:
        return method(self.rounds, self.sittings)

    def row(self, config: str) -> dict:
        return self.summary.set_index("config").loc[config].to_dict()


def _spec(profile, config: Config, r: int, scratch: Path | None, overrides: dict,
          artefacts: Path | None = None, save_output: bool | None = None) -> dict:
    return {"profile": profile.name, "stack": config.stack, "batch_size": config.batch_size, "round": r,
            "scratch": str(scratch) if scratch else None, "artefacts": str(artefacts) if artefacts else None,
            "save_output": r == 0 if save_output is None else save_output, "env": worker.sdperf_environment(),
            **overrides}


def _role(config: Config) -> str:
    return {BASELINE: ledgers.BASELINE_ROLE, TWIN: ledgers.TWIN_ROLE}.get(config.name, ledgers.CONFIG_ROLE)


def _entries(records: list[dict], role: str, stack: str) -> list[dict]:
    return [r for r in records if r["role"] == role and r["stack"] == stack]


def _plan(configs: list[Config], gone: dict, records: list[dict], rounds: int, b: int,
          now: float, every: int | None = None, sitting: str | None = None) -> list[tuple[int, Config]]:
    """What is left to launch given the ledger (missing rounds only), opening on its last baseline when recent."""
    todo, seen, done = [], set(), {}
    for c in configs:
        if c.name in gone or c.stack in seen:
            continue
        seen.add(c.stack)
        mine = _entries(records, ledgers.CONFIG_ROLE, c.stack)
        bad = next((r for r in mine if r["status"] != "ok"), None)
        if bad:
            gone[c.name] = {"status": bad["status"], "note": bad.get("note", "")}
            continue
        done[c.name] = {int(r["round"]) for r in mine}
        if len(done[c.name] & set(range(rounds))) < rounds:
            todo.append(c)
    twins = [r for r in _entries(records, ledgers.TWIN_ROLE, BASELINE_KEY) if r["status"] == "ok"]
    done[TWIN] = {int(r["round"]) for r in twins}
    twin_done = len(done[TWIN] & set(range(rounds))) >= rounds
    have_base = any(r["status"] == "ok" for r in _entries(records, ledgers.BASELINE_ROLE, BASELINE_KEY))
    if not todo and twin_done:
        return []
    if not todo and all(c.name in gone for c in configs) and configs:
        # nothing to compare, so no twin; the baseline alone still measures what the notebook reads from it
        return [] if have_base else [(r, Config(BASELINE, batch_size=b)) for r in range(rounds)]
    plan = schedule(todo, rounds, twin=not twin_done, every=every, done=done)
    last = records[-1] if records else None
    if plan and last and last["role"] == ledgers.BASELINE_ROLE and last.get("status") == "ok" \
            and last.get("sitting") == sitting and now - float(last.get("t_end", 0)) < REUSE_BASELINE_S:
        plan = plan[1:]
    return plan


def _unavailable(profile, configs: list[Config]) -> dict:
    """{name: status and note} of the configurations that cannot run here (availability) or now (memory)."""
    gone = {}
    for c in configs:
        ok, reason = Stack.of(c.stack).availability(Context(profile, batch_size=c.batch_size))
        if not ok:
            gone[c.name] = {"status": "not_applicable", "note": f"not applicable: {reason}"}
        elif (why := too_big(profile, c)) is not None:
            gone[c.name] = {"status": "skipped", "note": why}
    return gone


def pending(profile, configs: list[Config], *, ledger: Path, rounds: int | None = None,
            every: int | None = None) -> int:
    """How many workers run() would launch now for `configs` with `ledger` (sdperf.run.eta), launching nothing."""
    rounds = rounds or getattr(profile, "rounds", MIN_ROUNDS)
    b = _batch_size(configs)
    book = ledgers.Ledger(ledger, sitting=environment.run_id())
    return len(_plan(configs, _unavailable(profile, configs), book.records(b), rounds, b, time.time(), every,
                     book.sitting))


def run(profile, configs: list[Config], *, rounds: int | None = None, scratch: Path | None = None,
        overrides: dict | None = None, say: Callable[[str], None] = print,
        launcher: Callable | None = None, artefacts: Path | None = None, ledger: Path | None = None,
        every: int | None = None) -> Measured:
    """Measure `configs` (and the baseline and its twin) in fresh processes over `rounds` rounds; one that cannot
    run or fails is not launched again. `scratch`: what every comparison may reuse; `artefacts`: this run's engines;
    `ledger`: the run's shared worker results (private when None)."""
    rounds = rounds or getattr(profile, "rounds", MIN_ROUNDS)
    names = [c.name for c in configs]
    clash = {n for n in names if names.count(n) > 1} | ({BASELINE, TWIN} & set(names))
    if clash:
        raise ValueError(f"configuration names must be unique and not {BASELINE!r}/{TWIN!r}: {', '.join(clash)}")
    b = _batch_size(configs)
    if ledger is None:
        with tempfile.TemporaryDirectory(prefix="sdperf-ledger-") as tmp:
            return run(profile, configs, rounds=rounds, scratch=scratch, overrides=overrides, say=say,
                       launcher=launcher, artefacts=artefacts, ledger=Path(tmp), every=every)
    book = ledgers.Ledger(ledger, sitting=environment.run_id())
    launcher = launcher or launch
    gone = _unavailable(profile, configs)
    base_why = too_big(profile, Config(BASELINE, batch_size=b))
    if base_why is not None:  # nothing is compared without its baseline: every configuration is skipped with it
        say(f"  {BASELINE}: {base_why}")
        for c in configs:
            gone.setdefault(c.name, {"status": "skipped", "note": f"its fp32 eager baseline is {base_why}"})
        return _measured(book, configs, gone, rounds, b, base_skipped=base_why)
    # when one configuration that runs needs another allocator, every worker starts from its setting's server
    own_servers = {Stack.of(c.stack).allocator for c in configs if c.name not in gone} - {"default"} != set()
    records = book.records(b)
    plan = _plan(configs, gone, records, rounds, b, time.time(), every, book.sitting)
    kept = [r for r in records if r["role"] != ledgers.BASELINE_ROLE and r.get("sitting") != book.sitting]
    if plan and kept:
        say(f"resuming: {len(kept)} worker results of earlier sittings ({', '.join(book.sittings(b))}) kept, "
            f"{sum(c.name != BASELINE for _, c in plan)} left to measure")
    closes = closing(plan)
    failed, started = set(), time.time()
    try:
        for i, (r, c) in enumerate(plan, start=1):
            role = _role(c)
            if c.stack in failed and role == ledgers.CONFIG_ROLE:
                continue
            rest = (time.time() - started) / (i - 1) * (len(plan) - i + 1) if i > 1 else None
            say(f"[{i}/{len(plan)}] round {r}: {c.name}" + (f" (about {rest / 60:.0f} min left in these rounds)"
                                                            if rest is not None and rest >= 60 else ""))
            spec = _spec(profile, c, r, scratch, overrides or {}, artefacts,
                         save_output=not book.has_output(role, c.stack, b))
            why = too_big(profile, c)  # memory taken since the run began (a neighbour, a leak) counts too
            result, output = ({"status": "skipped", "note": why}, None) if why is not None else _quiet_launch(
                launcher, spec, c, say, setting=Stack.of(c.stack).allocator, allocator_server=own_servers,
                timeout_s=getattr(profile, "cell_timeout_s", None))
            if result["status"] != "ok":
                failed.add(c.stack)
                say(f"  {c.name}: {result['status']}: {result.get('note', '')}")
            book.append({"role": role, "stack": c.stack, "batch_size": b, "round": r, **result}, output)
            if i - 1 in closes:
                book.close_round(closes[i - 1], b)
    finally:
        allocator_servers.stop_all()  # their workers have ended; each server holds its imported libraries
    return _measured(book, configs, gone, rounds, b)


def _quiet_launch(launcher: Callable, spec: dict, config: Config, say, **kw) -> tuple[dict, object | None]:
    """One worker, measured again (BESIDE_LOAD_RETRIES) once the machine is quiet when others' load reached it."""
    result, output = launcher(spec, **kw)
    for _ in range(BESIDE_LOAD_RETRIES):
        if result.get("status") != "ok" or not contention.contended(result.get("contention")):
            return result, output
        say(f"  {config.name}: {contention.words(result['contention'])}; measured again once the machine is quiet")
        contention.wait_quiet(say=say)
        result, output = launcher(spec, **kw)
    if result.get("status") == "ok" and contention.contended(result.get("contention")):
        say(f"  {config.name}: still {contention.words(result['contention'])}: kept, and its ratios marked")
    return result, output


def beside_load(raw: pd.DataFrame) -> dict[str, str]:
    """{configuration: why its figures may be wrong} where others' load reached its worker or its round's baseline."""
    if "contention" not in raw or raw.empty:
        return {}
    ok = raw[raw.status == "ok"]
    share = contention.threshold()
    hit = ok[[contention.contended(c, share) if isinstance(c, dict) else False for c in ok.contention]]
    if hit.empty:
        return {}
    base_rounds = set(hit.loc[hit.config == BASELINE, "round"])
    said = {}
    for name, g in ok.groupby("config", sort=False):
        rounds_hit = set(hit.loc[hit.config == name, "round"]) | (base_rounds & set(g["round"]))
        if not rounds_hit:
            continue
        involved = hit[((hit.config == name) | (hit.config == BASELINE)) & hit["round"].isin(rounds_hit)]
        worst = max(c["share"] for c in involved.contention)
        said[name] = (f"{contention.BESIDE_LOAD} in {len(rounds_hit)} of {g['round'].nunique()} round(s): other "
                      f"processes took up to {worst:.0%} of the CPUs' time while it or its round's baseline was "
                      f"timed (over {share:.0%} voids a timing); these figures may be wrong")
    return said


def reached_words(rows: pd.DataFrame) -> str:
    """The mark for figures from these workers (one configuration's) when others' load reached any, else ''."""
    if "contention" not in rows or rows.empty:
        return ""
    share = contention.threshold()
    hit = [c for c in rows.contention if isinstance(c, dict) and contention.contended(c, share)]
    if not hit:
        return ""
    return (f"{contention.BESIDE_LOAD} in {len(hit)} of {len(rows)} process(es): other processes took up to "
            f"{max(c['share'] for c in hit):.0%} of the CPUs' time while timed (over {share:.0%} voids a timing); "
            "these figures may be wrong")


def _measured(book: ledgers.Ledger, configs: list[Config], gone: dict, rounds: int, b: int,
              base_skipped: str | None = None) -> Measured:
    """The comparison of `configs` from the ledger (`base_skipped`: why the baseline could not run)."""
    records = book.records(b)
    rows = [{"config": BASELINE, **r} for r in _entries(records, ledgers.BASELINE_ROLE, BASELINE_KEY)]
    if base_skipped is not None and not rows:
        rows.append({"config": BASELINE, "stack": BASELINE_KEY, "round": 0, "status": "skipped",
                     "note": base_skipped})
    rows += [{"config": TWIN, **r} for r in _entries(records, ledgers.TWIN_ROLE, BASELINE_KEY)]
    outputs = {BASELINE: book.output(ledgers.BASELINE_ROLE, BASELINE_KEY, b),
               TWIN: book.output(ledgers.TWIN_ROLE, BASELINE_KEY, b)}
    for c in configs:
        mine = _entries(records, ledgers.CONFIG_ROLE, c.stack)
        if c.name in gone and not mine:
            rows.append({"config": c.name, "stack": c.stack, "round": 0, **gone[c.name]})
            continue
        rows += [{"config": c.name, **r} for r in mine]
        outputs[c.name] = book.output(ledgers.CONFIG_ROLE, c.stack, b)
    raw = pd.DataFrame(rows)
    for col in ("t_start", "t_end", "latency_s", "unet_step_s", "s_per_image_seed", "note", "stack", "status"):
        if col not in raw:
            raw[col] = np.nan
    raw = with_baseline_decode(raw, b)
    ratios = per_round_ratios(raw)
    summary, bands = summarize(raw, ratios)
    facts = {r["config"]: r.get("facts") or {} for r in rows if r.get("status") == "ok"}
    drifts = {}
    if outputs.get(BASELINE) is not None:
        for name, out in outputs.items():
            if name != BASELINE and out is not None:
                d = drift.compare(out, outputs[BASELINE])
                d["verdict"] = drift.verdict(d)
                drifts[name] = d
    used = {r.get("sitting") for r in rows if r.get("status") == "ok" and r.get("sitting")}
    return Measured(rounds, raw, ratios, summary, bands, facts, drifts, sittings=max(len(used), 1),
                    beside_load=beside_load(raw))


def alone(profile, configs: list[Config], *, rounds: int | None = None, scratch: Path | None = None,
          overrides: dict | None = None, say: Callable[[str], None] = print,
          launcher: Callable | None = None) -> pd.DataFrame:
    """Each configuration in a fresh process once per round, rotated, without a baseline: one row per round."""
    rounds = rounds or getattr(profile, "rounds", MIN_ROUNDS)
    launcher = launcher or launch
    records = []
    try:
        for r in range(rounds):
            k = r % max(len(configs), 1)
            for c in configs[k:] + configs[:k]:
                say(f"round {r}: {c.name}")
                why = too_big(profile, c)
                if why is not None:
                    say(f"  {c.name}: {why}")
                    result = {"status": "skipped", "note": why}
                else:
                    result, _ = _quiet_launch(launcher, _spec(profile, c, r, scratch, overrides or {}), c, say,
                                              setting=Stack.of(c.stack).allocator,
                                              allocator_server=Stack.of(c.stack).allocator != "default",
                                              timeout_s=getattr(profile, "cell_timeout_s", None))
                records.append({"config": c.name, "stack": c.stack, "batch_size": c.batch_size, "round": r, **result})
    finally:
        allocator_servers.stop_all()
    return pd.DataFrame(records)
