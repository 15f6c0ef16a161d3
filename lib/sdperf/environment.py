"""The environment record stored beside every number: versions, device, CPU model and ISA, threads, commit."""
from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path

from sdperf.paths import REPO_ROOT

PACKAGES = ("torch", "torchvision", "diffusers", "transformers", "accelerate", "deepspeed", "onnx", "onnxruntime",
            "openvino", "torchmetrics", "torch-fidelity", "open-clip-torch", "papermill", "nbval", "numpy", "pandas")
# CPU features that decide which precisions can be fast here (see the half-precision notebook).
ISA_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution named (None when absent)."""
    out = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(root: Path = REPO_ROOT) -> str:
    """HEAD's short sha, '-dirty' when tracked sources differ from it (reports/ is output, not source);
    'unknown' outside a checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports").stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_isa() -> dict[str, bool]:
    flags = set(_cpuinfo().get("flags", "").split())
    return {f: f in flags for f in ISA_FLAGS}


def family_model_stepping() -> str:
    return "/".join(_cpuinfo().get(k, "?") for k in ("cpu family", "model", "stepping"))


def physical_cores() -> int | None:
    """Distinct (socket, core) pairs in /proc/cpuinfo: two hyper-threads of one core share its FMA units."""
    pairs, socket = set(), None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "physical id":
                socket = value
            elif key == "core id":
                pairs.add((socket, value))
    except OSError:
        return None
    return len(pairs) or None


def cpu_caches() -> str:
    """'L1d 48K, L1i 32K, L2 2048K, L3 107520K' of CPU 0, from sysfs (per core or shared, as the kernel reports)."""
    found = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        found.append(f"L{level}{dict(Data='d', Instruction='i').get(kind, '')} {size}")
    return ", ".join(found) or "unknown"


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def fingerprint(device: str = "cpu") -> str:
    """A short id of the machine a number belongs to: CPU model, family/model/stepping, logical CPUs, every ISA
    flag, and the GPU where one is used. Two rows with different fingerprints never share a table."""
    import hashlib

    info = _cpuinfo()
    parts = [cpu_model(), info.get("cpu family", ""), info.get("model", ""), info.get("stepping", ""),
             str(os.cpu_count()), info.get("flags", ""), device_name(device) if device != "cpu" else ""]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def run_id() -> str:
    """The id of this run: `sdperf run` sets SDPERF_RUN_ID for every notebook it runs; a notebook opened alone
    gets its own."""
    import uuid

    rid = os.environ.get(RUN_ID_ENV)
    if not rid:
        rid = os.environ[RUN_ID_ENV] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + \
            uuid.uuid4().hex[:6]
    return rid


RUN_ID_ENV = "SDPERF_RUN_ID"


def device_name(device: str) -> str:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return cpu_model()


def record(profile: str | None = None, device: str = "cpu") -> dict:
    """Everything a reader needs to judge a number taken here."""
    import torch

    return {
        "profile": profile,
        "device": device,
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "cpu_family_model_stepping": family_model_stepping(),
        "machine": fingerprint(device),
        "run_id": run_id(),
        "cpu_isa": cpu_isa(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "cpu_caches": cpu_caches(),
        "memory_gib": memory_gib(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "commit": git_commit(),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"},
        "time_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
