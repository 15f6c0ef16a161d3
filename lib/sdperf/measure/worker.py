"""One configuration measured in a process of its own: build, apply, first call, timed repeats, peak memory.

Started by sdperf.measure.rounds, it hands back one JSON file (and its output tensors when asked), written
atomically, with each stage's calls and the wall-clock window of the timed calls (the baseline is read there).
"""
from __future__ import annotations

import io
import json
import os
import resource
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

SEED_STEPS = 50  # the Cerebrium / NeMo setting: 50 PLMS steps per image
CALIBRATION_PROMPTS = 4  # the study's own captions a post-training int8 scheme calibrates on (one generation each)
RESULT, OUTPUT = "result.json", "output.pt"


def _jsonable(facts: dict) -> dict:
    out = {}
    for k, v in facts.items():
        if k == "compile_log":
            if v is not None:
                from sdperf.optimizations.torch_compile import compile_facts

                out.update(compile_facts(v))
            continue
        out[k] = v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
    return out


def _stage(stages, name: str, column: str) -> float:
    s = stages.set_index("stage")
    return float(s.loc[name, column]) if name in s.index else 0.0


def composed_seconds(stages, unet_calls: int) -> float:
    """One generation composed from its measured stages at `unet_calls` denoising iterations."""
    per_call = _stage(stages, "unet", "median_call_s") + _stage(stages, "scheduler", "median_call_s")
    return (_stage(stages, "text_encoder", "seconds_per_image_call") + unet_calls * per_call
            + _stage(stages, "vae_decode", "seconds_per_image_call"))


def loop_timesteps(pipe, steps: int) -> list:
    """The timesteps the loop calls the UNet at for `steps` with the pipeline's scheduler (PLMS repeats one)."""
    sched = pipe.scheduler
    sched.set_timesteps(steps, device="cpu")
    return [float(t) for t in sched.timesteps]


def call_kind_medians(calls: list[list[float]], kinds: list[str]) -> dict[str, float]:
    """Median UNet call time of each kind, from the timed generations' calls in order (each follows `kinds`)."""
    import numpy as np

    by: dict[str, list[float]] = {}
    for gen in calls:
        if len(gen) != len(kinds):
            raise RuntimeError(f"a generation made {len(gen)} UNet calls where the pattern has {len(kinds)}")
        for t, k in zip(gen, kinds):
            by.setdefault(k, []).append(t)
    return {k: float(np.median(v)) for k, v in by.items()}


def patterned(stages, medians: dict[str, float], kinds: list[str]) -> float:
    """One generation composed like composed_seconds, each UNet call at the median of its kind."""
    missing = sorted(set(kinds) - set(medians))
    if missing:
        raise RuntimeError(f"no timed UNet call of kind {', '.join(missing)}: the timed generation must hold "
                           "every kind the composed one does")
    return (_stage(stages, "text_encoder", "seconds_per_image_call") + sum(medians[k] for k in kinds)
            + len(kinds) * _stage(stages, "scheduler", "median_call_s")
            + _stage(stages, "vae_decode", "seconds_per_image_call"))


def _call_pattern(pipe, stack, run, workload, seed_steps: int) -> dict:
    """For a stack whose UNet calls differ in cost: each kind's median and the generations composed from them."""
    kinds_run = stack.call_kinds(loop_timesteps(pipe, workload.steps))
    medians = call_kind_medians(run.unet_calls, kinds_run)
    kinds_seed = stack.call_kinds(loop_timesteps(pipe, seed_steps))
    seed = patterned(run.stages, medians, kinds_seed)
    return {"unet_kind_s": medians, "seed_call_kinds": {k: kinds_seed.count(k) for k in sorted(set(kinds_seed))},
            "seed_s": seed, "composed_s": patterned(run.stages, medians, kinds_run),
            "unet_step_s": sum(medians[k] for k in kinds_seed) / len(kinds_seed)}  # the mean call at seed steps


def _decoded(pipe, latents):
    import torch

    from sdperf.model.generation import decode, module_device

    with torch.inference_mode():
        return decode(pipe, latents.to(module_device(pipe.vae))).detach().cpu()


def measure(spec: dict) -> tuple[dict, object | None]:
    """Build, apply and time one configuration; (result, output or None). Runs inside the worker process."""
    import torch

    from sdperf.measure.measurements import timed_generation
    from sdperf.optimizations import fewer_steps
    from sdperf.optimizations.catalog import Context, Stack
    from sdperf.model.pipelines import build_pipeline
    from sdperf.config.profiles import load_profile
    from sdperf.model.prompts import smoke_captions
    from sdperf.measure.timing import peak_memory, reset_peak_memory
    from sdperf.optimizations import allocator

    profile = load_profile(spec["profile"], check_runtime=False)
    profile = replace(profile, **{k: spec[k] for k in ("warmup", "repeats") if spec.get(k) is not None})
    stack = Stack.of(spec["stack"])
    ctx = Context(profile, batch_size=spec.get("batch_size", 1),
                  prompts=tuple(c.text for c in smoke_captions()[:CALIBRATION_PROMPTS]),
                  scratch=Path(spec["scratch"]) if spec.get("scratch") else None,
                  artefacts=Path(spec["artefacts"]) if spec.get("artefacts") else None)
    ok, reason = stack.availability(ctx)
    if not ok:
        return {"status": "not_applicable", "note": f"not applicable: {reason}"}, None
    device = profile.device
    t0 = time.perf_counter()
    pipe = build_pipeline(profile, weights_cache=ctx.scratch / "weights" if ctx.scratch else None)
    build_s = time.perf_counter() - t0
    reset_peak_memory(device)
    t0 = time.perf_counter()
    pipe = stack.apply(pipe, ctx)
    setup_s = time.perf_counter() - t0
    setup_peak = peak_memory(device)[0]
    workload = ctx.workload()
    decoded = not stack.loop_only
    started = time.time()
    run = timed_generation(pipe, workload, device=device, warmup=profile.warmup, repeats=profile.repeats,
                           grad_mode=stack.grad_mode, label=stack.label,
                           first_call_steps=profile.first_call_steps, decode_images=decoded)
    finished = time.time()
    if not decoded and spec.get("save_output"):  # the drift rows compare images too: decoded once, untimed
        run.output.images = _decoded(pipe, run.output.latents)
    seed_calls = fewer_steps.unet_calls(pipe, stack.steps or SEED_STEPS)
    s = run.summary()
    b = workload.batch_size
    seed_s, composed_s = composed_seconds(run.stages, seed_calls), composed_seconds(run.stages, s["iterations"])
    pattern = None
    if stack.call_kinds is not None:
        pattern = _call_pattern(pipe, stack, run, workload, stack.steps or SEED_STEPS)
        seed_s, composed_s, s["unet_step_s"] = pattern["seed_s"], pattern["composed_s"], pattern["unet_step_s"]
    result = {
        "status": "ok", "note": "", "build_s": build_s, "setup_s": setup_s,
        "setup_peak_mib": None if setup_peak is None else setup_peak / 2**20, "first_call_s": s["first_call_s"],
        "first_call_steps": profile.first_call_steps or workload.steps, "latency_s": s["latency_s"],
        "p10_s": s["p10_s"], "p90_s": s["p90_s"], "n": len(run.timing.times), "s_per_image": s["s_per_image"],
        "unet_step_s": s["unet_step_s"], "it_per_s": s["it_per_s"], "iterations": s["iterations"],
        "steps": workload.steps, "seed_steps": stack.steps or SEED_STEPS, "seed_unet_calls": seed_calls,
        "s_per_image_seed": seed_s / b, "s_per_image_composed": composed_s / b,
        "unet_kind_s": None if pattern is None else pattern["unet_kind_s"],
        "seed_call_kinds": None if pattern is None else pattern["seed_call_kinds"],
        "stages": run.stages.to_dict("records"), "decoded": decoded,
        "vae_decode_s": _stage(run.stages, "vae_decode", "seconds_per_image_call") if decoded else None,
        "peak_memory_mib": s["peak_memory_mib"], "memory_kind": run.timing.memory_kind,
        "process_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "contention": run.timing.contention, "t_start": started, "t_end": finished, "threads": torch.get_num_threads(),
        "pid": os.getpid(), "allocator": stack.allocator, "allocator_in_effect": allocator.in_effect(stack.allocator),
        "facts": _jsonable(ctx.facts),
    }
    return result, run.output


ENV_PREFIX = "SDPERF_"


def sdperf_environment() -> dict[str, str]:
    """The SDPERF_* variables of the launching process (params and reports folders, run id, profile)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}


def _adopt(env: dict[str, str] | None) -> None:
    """Take the launcher's SDPERF_* variables as they are now: a fork server keeps those of the moment it started."""
    if env is None:
        return
    for k in [k for k in os.environ if k.startswith(ENV_PREFIX) and k not in env]:
        del os.environ[k]
    os.environ.update(env)


LOG_ENV = "SDPERF_LOG"


def to_log() -> None:
    """Send this process's console output to LOG_ENV, so the console shows only the study's own progress."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:  # a log that cannot be opened must not stop a measurement
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_to(spec: dict, out: Path) -> None:
    """measure(), its result or error written atomically into `out`; the worker dies with its parent (lifeline)."""
    from sdperf.measure import lifeline

    lifeline.die_with_parent()
    lifeline.exit_if_orphaned(spec.get("launcher_pid"))
    import torch

    from sdperf.store.results import atomic_write_bytes, atomic_write_text

    _adopt(spec.get("env"))
    to_log()
    out = Path(out)
    try:
        result, output = measure(spec)
    except Exception as exc:  # a technique this stack cannot run: the parent records it as failed
        text = str(exc).strip()
        result, output = {"status": "failed", "note": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}",
                          "traceback": traceback.format_exc()[-4000:]}, None
    if output is not None and spec.get("save_output"):
        buf = io.BytesIO()
        torch.save({"latents": output.latents, "images": output.images}, buf)
        atomic_write_bytes(out / OUTPUT, buf.getvalue())
    atomic_write_text(out / RESULT, json.dumps(result, default=float))
