"""Run each configuration in a fresh torchrun process group, and the sweep over world sizes and batch sizes.

Every launch setting (world size against the devices or cores here, backend, batch size, engine) is checked before
anything is spawned, naming the value and the choices. A configuration that starts and then fails (out of memory, a
DeepSpeed op that cannot build) becomes a `failed` row carrying the worker's own error line; the sweep goes on. On a
CPU the ranks share the cores: each gets thread_budget() // world size threads (OMP_NUM_THREADS).
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sdperf.core.errors import ConfigError
from sdperf.training import collect, zero
from sdperf.training.training_settings import AUTO, BACKENDS, ENGINES, TrainingSettings
from sdperf.training.spec import RunSpec

LIB_DIR = Path(__file__).resolve().parents[2]  # the folder holding the sdperf package, for the workers' path


@dataclass(frozen=True)
class Config:
    """One point of the sweep."""

    engine: str
    world_size: int
    per_rank_batch: int
    threads_per_rank: int
    control: bool = False  # the equal-threads control: one rank with the threads a rank gets at the largest size

    @property
    def label(self) -> str:
        base = f"{self.engine}, world {self.world_size}, batch {self.per_rank_batch}/rank"
        return base + (f", {self.threads_per_rank} thread(s) (equal-threads control)" if self.control else "")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_budget() -> int:
    """CPU threads the sweep may use in all: the usable cores, or fewer when $OMP_NUM_THREADS says so."""
    cores = usable_cores()
    env = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cores, int(env))) if env.isdigit() and int(env) > 0 else cores


def available_devices(device: str) -> int:
    """Ranks one machine can host: CUDA devices, or CPU cores (a rank needs at least one)."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return usable_cores()


def auto_world_sizes(device: str) -> tuple[int, ...]:
    n = available_devices(device)
    return tuple(2**k for k in range(n.bit_length()) if 2**k <= n)


def resolve_backend(backend: str, device: str) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not valid; choose one of: {', '.join(BACKENDS)}")
    if backend == AUTO:
        return "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ConfigError(f"backend 'nccl' needs CUDA devices and this run is on {device!r}; "
                          "choose one of: gloo, auto")
    return backend


def check_launch(world_size, per_rank_batch, backend: str, device: str, engine: str = "ddp") -> str:
    """Fail before spawning anything; returns the resolved backend."""
    resolved = resolve_backend(backend, device)
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r} is not valid; choose one of: {', '.join(ENGINES)}")
    have = available_devices(device)
    what = "CUDA devices" if device == "cuda" else "CPU cores"
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world size must be an integer >= 1, got {world_size!r}")
    if world_size > have:
        valid = ", ".join(map(str, range(1, have + 1))) or "none"
        raise ConfigError(f"world size {world_size} is larger than the {have} {what} available here "
                          f"(one rank per {what[:-1]}); valid world sizes on this machine: {valid}. Across "
                          "machines, launch torchrun on each with its rendezvous flags (see README)")
    if not isinstance(per_rank_batch, int) or isinstance(per_rank_batch, bool) or per_rank_batch < 1:
        raise ConfigError(f"per-rank batch size must be an integer >= 1, got {per_rank_batch!r}")
    return resolved


def threads_per_rank(device: str, world_size: int) -> int:
    return 1 if device == "cuda" else max(1, thread_budget() // world_size)


def plan(profile, settings: TrainingSettings, world_sizes=None, batch_sizes=None) -> list[Config]:
    """Every configuration of the sweep, validated as a whole before the first one runs: DDP at every (world size,
    per-rank batch); each ZeRO stage at every world size above one with the first batch size; on a CPU, the
    equal-threads control (one rank, the threads each rank gets at the largest world size) when that differs from
    the one-rank run, so the DDP overhead can be told apart from thread scaling."""
    worlds = tuple(world_sizes or ())
    worlds = worlds or (auto_world_sizes(profile.device) if settings.world_sizes == AUTO else settings.world_sizes)
    batches = tuple(batch_sizes or ()) or settings.batch_sizes
    for w in worlds:
        for b in batches:
            check_launch(w, b, settings.backend, profile.device)
    if settings.samples < max(worlds) * max(batches):
        raise ConfigError(f"training.samples {settings.samples} cannot fill one step of {max(worlds)} ranks x "
                          f"{max(batches)} per rank; use samples >= {max(worlds) * max(batches)}")
    configs = [Config("ddp", w, b, threads_per_rank(profile.device, w)) for w in worlds for b in batches]
    control = threads_per_rank(profile.device, max(worlds))
    if settings.equal_threads_control and profile.device == "cpu" and control != threads_per_rank("cpu", 1):
        configs += [Config("ddp", 1, b, control, control=True) for b in batches]
    for stage in settings.deepspeed_zero_stages:  # one rank has nothing to shard: ZeRO runs from two ranks up
        engine = f"zero{stage}"
        configs += [Config(engine, w, batches[0], threads_per_rank(profile.device, w)) for w in worlds if w > 1]
    return configs


def torchrun_command(world_size: int, spec_path: Path) -> list[str]:
    """`torchrun --standalone`: a fresh single-machine rendezvous on a free port for every configuration."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "--max-restarts=0", "-m", "sdperf.training.train", "--spec", str(spec_path)]


def worker_env(threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(LIB_DIR)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


TIMED_OUT = -9999  # _run's return code when it ended the process group itself
_PREFIX = re.compile(r"^(?:\[[\w:/.-]+\]:?\s*)+")  # torch's per-rank prefixes, e.g. "[rank0]: "
_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt)):\s*(.*)$")


def error_line(output: str) -> str:
    """The workers' own exception line (the root cause), not torchrun's ChildFailedError summary."""
    hits = [m for m in (_ERROR.match(_PREFIX.sub("", line.strip())) for line in output.splitlines()) if m]
    root = [m for m in hits if m.group(1) not in ("ChildFailedError", "CalledProcessError")]
    if root:
        return f"{root[0].group(1)}: {root[0].group(2)}"[:500]
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:500]


def _run(cmd: list[str], env: dict, timeout_s: int) -> tuple[int, str]:
    """Run in its own process group so a timeout ends torchrun and its workers together."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return TIMED_OUT, out or ""


def _row(config: Config, status: str, note: str, **extra) -> dict:
    return {"label": config.label, "engine": config.engine, "world_size": config.world_size,
            "per_rank_batch": config.per_rank_batch, "global_batch": config.per_rank_batch * config.world_size,
            "threads_per_rank": config.threads_per_rank, "control": config.control, "status": status,
            "note": note, **extra}


def run_config(profile, settings: TrainingSettings, config: Config, data_path: Path | None,
               workdir: Path | None = None) -> dict:
    """One configuration in a fresh process group; its summary row (status ok, not_applicable or failed)."""
    backend = check_launch(config.world_size, config.per_rank_batch, settings.backend, profile.device, config.engine)
    ok, why = zero.availability(config.engine, settings.autocast)
    if not ok:
        return _row(config, "not_applicable", f"not applicable: {why}")
    with tempfile.TemporaryDirectory(prefix="sdperf-train-", dir=workdir) as tmp:
        out = Path(tmp)
        ds_config = None
        if config.engine != "ddp":
            cfg = zero.config(config.engine, config.per_rank_batch, config.world_size, settings.max_grad_norm)
            ds_config = str(zero.write_config(out / f"ds_config_{config.engine}.json", cfg))
        spec = RunSpec(profile=profile.name, arch=profile.arch, weights=profile.weights, seed=profile.seed,
                       device=profile.device, settings=settings, engine=config.engine,
                       per_rank_batch=config.per_rank_batch, threads_per_rank=config.threads_per_rank,
                       backend=backend, out_dir=str(out), data_path=str(data_path) if data_path else None,
                       deepspeed_config=ds_config, label=config.label)
        spec_path = out / "spec.json"
        spec_path.write_text(spec.to_json())
        t0 = time.perf_counter()
        code, output = _run(torchrun_command(config.world_size, spec_path), worker_env(config.threads_per_rank),
                            settings.run_timeout_s)
        wall = time.perf_counter() - t0
        if code == TIMED_OUT:
            return _row(config, "failed", f"timed out: ran past training.run_timeout_s={settings.run_timeout_s} s "
                                          "and was stopped (SIGTERM, then SIGKILL)", launch_s=wall)
        if code != 0:
            return _row(config, "failed", error_line(output), launch_s=wall)
        try:
            row = collect.read_run(out)
        except ValueError as exc:
            return _row(config, "failed", f"{exc}; last output: {error_line(output)}", launch_s=wall)
    return dict(row, label=config.label, control=config.control, launch_s=wall)


def sweep(profile, settings: TrainingSettings, configs: list[Config], data_path: Path | None, progress=None):
    """Run every configuration in order; a pandas table, one row each (failures included, with their reason)."""
    import pandas as pd

    rows = []
    for config in configs:
        if progress:
            progress(f"running {config.label}")
        rows.append(run_config(profile, settings, config, data_path))
    return pd.DataFrame(rows)


def as_dict(config: Config) -> dict:
    return dict(dataclasses.asdict(config), label=config.label)
