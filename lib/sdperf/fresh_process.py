"""Measure the fp32 eager generation in a fresh Python process, under a chosen allocator.

Why a fresh process: an allocator is fixed when the process starts, and one process can hide drift (memory mapped
by an earlier variant makes a later baseline faster). The child builds the profile's pipeline, times it exactly as
the notebooks do, and hands back its timing and output through files written atomically.

    python -m sdperf.fresh_process --profile cpu --out DIR      (the parent sets the environment)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sdperf.optimizations import allocator


@dataclass
class FreshRun:
    setting: str
    summary: dict  # GenerationRun.summary() of the child
    stages: list[dict]
    latents: object  # torch.Tensor
    images: object
    faults_per_generation: float | None


def _minor_faults() -> int | None:
    try:
        return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return None


def child(profile_name: str, out: Path, batch_size: int = 1) -> None:
    import torch

    from sdperf.generation import Workload
    from sdperf.measurements import timed_generation
    from sdperf.pipelines import build_pipeline
    from sdperf.profiles import load_profile
    from sdperf.results import atomic_write_bytes, atomic_write_text

    p = load_profile(profile_name)
    pipe = build_pipeline(p)
    workload = Workload.from_profile(p, batch_size=batch_size)
    before = _minor_faults()
    run = timed_generation(pipe, workload, device=p.device, warmup=p.warmup, repeats=p.repeats,
                           label="fp32 eager (fresh process)")
    after = _minor_faults()
    calls = 1 + max(p.warmup - 1, 0) + p.repeats
    faults = None if before is None or after is None else (after - before) / calls
    import io

    buf = io.BytesIO()
    torch.save({"latents": run.output.latents, "images": run.output.images}, buf)
    atomic_write_bytes(out / "output.pt", buf.getvalue())
    atomic_write_text(out / "run.json", json.dumps({"summary": run.summary(), "stages": run.stages.to_dict("records"),
                                                    "faults_per_generation": faults}, default=float))


def measure(profile_name: str, setting: str, *, batch_size: int = 1, timeout_s: int = 3600) -> FreshRun:
    """Run `child` under `setting` and read back what it measured; the child's error is raised with its stderr."""
    import torch

    env = allocator.environment(setting)
    with tempfile.TemporaryDirectory(prefix="sdperf-fresh-") as tmp:
        cmd = [sys.executable, "-m", "sdperf.fresh_process", "--profile", profile_name, "--out", tmp,
               "--batch-size", str(batch_size)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            raise RuntimeError(f"fresh process ({setting}) exited {proc.returncode}: {last}")
        meta = json.loads((Path(tmp) / "run.json").read_text())
        out = torch.load(Path(tmp) / "output.pt")
    return FreshRun(setting, meta["summary"], meta["stages"], out["latents"], out["images"],
                    meta["faults_per_generation"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdperf.fresh_process", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batch-size", type=int, default=1)
    args = ap.parse_args(argv)
    child(args.profile, args.out, args.batch_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
