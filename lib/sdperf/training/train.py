"""The per-rank training program torchrun starts: one configuration, timed, written as rank<N>.json.

Each rank builds the same seeded UNet, joins the process group, draws its shard through a seeded DistributedSampler
and times the steps with timing.measure; its record is written atomically, so a killed run leaves no half file.

One machine, N ranks (CPU: threads split between them via OMP_NUM_THREADS):
    torchrun --standalone --nproc_per_node N -m sdperf.training.train --profile cpu --batch-size 2 --out DIR
Several machines (run on each, same --rdzv_id and endpoint; --node_rank optional with c10d rendezvous):
    torchrun --nnodes M --nproc_per_node N --rdzv_backend c10d --rdzv_endpoint HOST:29500 --rdzv_id sdperf \\
        -m sdperf.training.train --profile sd15-a100 --batch-size 32 --data latents.pt --out DIR
then `python -m sdperf.training.collect DIR` (or the notebook's `extra_runs`) reads the per-rank records.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

from sdperf.training.training_settings import ENGINES
from sdperf.training.spec import RunSpec


def _dist_env() -> tuple[int, int, int]:
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        raise SystemExit("sdperf.training.train is started by torchrun (RANK/WORLD_SIZE are not set); see "
                         "`python -m sdperf.training.train --help`")
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))


def _dataset(spec: RunSpec):
    from sdperf.config.profiles import load_profile
    from sdperf.training import dataset

    if spec.data_path:
        return dataset.load(Path(spec.data_path))
    tensors, _ = dataset.make(load_profile(spec.profile), spec.settings)
    return dataset.LatentDataset(tensors)


def _trainer(spec: RunSpec, unet, device, rank: int):
    """DDP or a DeepSpeed engine around the UNet, with AdamW and the step; the UNet itself stays reachable."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from sdperf.training import model, step, zero

    s = spec.settings
    sched = model.noise_scheduler(spec.arch, spec.weights)
    seed = spec.seed * 100_003 + rank  # each rank draws its own noise and timesteps, reproducibly
    if spec.engine == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(unet, device_ids=ids, gradient_as_bucket_view=True)
        return step.Trainer(ddp, sched, device, s.learning_rate, s.weight_decay, s.max_grad_norm, s.autocast, seed)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=s.learning_rate, weight_decay=s.weight_decay)
    engine = zero.initialize(unet, optimizer, Path(spec.deepspeed_config))
    return step.ZeroTrainer(engine, sched, device, s.autocast, seed)


def resident_bytes(device) -> int | None:
    """Memory in use now: CUDA bytes allocated, or this process's resident set (VmRSS). Read before the UNet is
    built, it is what the rank holds for the runtime, libraries and dataset, apart from training itself."""
    import torch

    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _init_process_group(spec: RunSpec) -> None:
    import torch.distributed as dist

    if spec.engine == "ddp":
        dist.init_process_group(backend=spec.backend)
    else:
        import deepspeed

        from sdperf.training import zero

        zero.without_shm_comm()
        deepspeed.init_distributed(dist_backend=spec.backend)


def run(spec: RunSpec) -> dict:
    """Train `warmup_steps + steps` steps on this rank; returns (and writes) this rank's record."""
    import torch
    import torch.distributed as dist

    from sdperf.measure import timing
    from sdperf.store.results import atomic_write_text
    from sdperf.training import dataset, model, step

    rank, world, local = _dist_env()
    torch.set_num_threads(spec.threads_per_rank)
    device = torch.device("cuda", local) if spec.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    t0 = time.perf_counter()
    _init_process_group(spec)
    s = spec.settings
    samples = _dataset(spec)
    baseline = resident_bytes(device)
    unet = model.build_unet(spec.arch, s.unet_width, spec.seed, spec.weights).to(device)
    before = step.parameter_digest(unet)
    trainer = _trainer(spec, unet, device, rank)
    batches = dataset.batches(samples, world, rank, spec.per_rank_batch, spec.seed)
    losses = []
    setup_s = time.perf_counter() - t0
    t = timing.measure(lambda: losses.append(trainer.step(next(batches))), device=device.type,
                       warmup=s.warmup_steps, repeats=s.steps)
    record = {
        "rank": rank, "world_size": world, "local_rank": local, "host": socket.gethostname(), "label": spec.label,
        "engine": spec.engine, "backend": dist.get_backend(), "device": spec.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "per_rank_batch": spec.per_rank_batch,
        "global_batch": spec.per_rank_batch * world, "autocast": s.autocast, "unet_width": s.unet_width,
        "unet": model.describe(spec.arch, s.unet_width, unet),
        "unet_parameters": sum(p.numel() for p in unet.parameters()), "resolution": s.resolution, "setup_s": setup_s,
        "first_step_s": t.first_call, "step_times_s": t.times, "peak_memory_bytes": t.peak_memory_bytes,
        "memory_kind": t.memory_kind, "baseline_memory_bytes": baseline, "losses": [float(x) for x in losses],
        "params_before": before, "params_after": step.parameter_digest(unet), "torch": torch.__version__,
    }
    atomic_write_text(Path(spec.out_dir) / f"rank{rank}.json", json.dumps(record, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return record


def spec_from_args(args) -> RunSpec:
    """A RunSpec from the command line (hand-launched runs, e.g. multi-node): the profile's settings."""
    import torch

    from sdperf.config.profiles import load_profile
    from sdperf.training import launch, training_settings

    profile = load_profile(args.profile)
    s = training_settings.from_profile(profile)
    world = int(os.environ.get("WORLD_SIZE", 1))
    threads = int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))
    out = Path(args.out)
    ds_config = None
    if args.engine != "ddp":
        from sdperf.training import zero

        ds_config = str(zero.write_config(out / f"ds_config_{args.engine}.json",
                                          zero.config(args.engine, args.batch_size, world, s.max_grad_norm)))
    return RunSpec(profile=profile.name, arch=profile.arch, weights=profile.weights, seed=profile.seed,
                   device=profile.device, settings=s, engine=args.engine, per_rank_batch=args.batch_size,
                   threads_per_rank=threads, backend=launch.resolve_backend(s.backend, profile.device),
                   out_dir=str(out), data_path=args.data, deepspeed_config=ds_config, label="by hand")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchrun ... -m sdperf.training.train", description=__doc__.splitlines()[0],
                                 epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--spec", type=Path, help="a RunSpec JSON written by sdperf.training.launch")
    ap.add_argument("--profile", help="a params/*.yml name (hand-launched runs)")
    ap.add_argument("--batch-size", type=int, default=1, help="per-rank micro batch")
    ap.add_argument("--engine", choices=ENGINES, default="ddp")
    ap.add_argument("--data", help="a dataset file from `python -m sdperf.training.dataset` (else made per rank)")
    ap.add_argument("--out", help="folder for the rank<N>.json records")
    args = ap.parse_args(argv)
    if args.spec:
        spec = RunSpec.from_json(args.spec.read_text())
    elif args.profile and args.out:
        spec = spec_from_args(args)
    else:
        ap.error("give --spec, or --profile and --out")
    Path(spec.out_dir).mkdir(parents=True, exist_ok=True)
    run(spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
