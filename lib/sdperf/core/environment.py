"""The environment record stored beside every number: versions, device, CPU model and ISA, threads, commit."""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.metadata as md
import os
import platform
import subprocess
import uuid
from pathlib import Path

from sdperf.core.paths import REPO_ROOT

# The libraries every rung's speed or quality depends on; the techniques' own come through record(packages=...).
PACKAGES = ("torch", "torchvision", "diffusers", "transformers", "accelerate", "mlcommons-loadgen", "torchmetrics",
            "torch-fidelity", "open-clip-torch", "papermill", "nbval", "numpy", "pandas")
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
    """HEAD's short sha, '-dirty' when tracked sources (not reports/) differ from it; 'unknown' outside a checkout."""
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


# The variables that decide how many threads OpenMP, MKL and OpenBLAS start and where they run.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
              "OMP_WAIT_POLICY", "KMP_AFFINITY", "KMP_BLOCKTIME", "GOMP_CPU_AFFINITY")
ALLOCATOR_LIBS = ("libjemalloc", "libtcmalloc", "libmimalloc")  # preloadable in place of glibc's malloc
NO_GPU = "not applicable: no CUDA device"


def _parallel_line(info: str, label: str) -> str | None:
    """The value after `label` in torch.__config__.parallel_info() ('omp_get_max_threads() : 2' -> '2')."""
    for line in info.splitlines():
        key, sep, value = line.strip().partition(" : " if label.endswith("()") else ": ")
        if sep and key == label:
            return value.strip()
    return None


def thread_settings() -> dict:
    """How this process runs operators in parallel, as torch reports it, and the environment variables that set it."""
    import torch

    info = torch.__config__.parallel_info()
    return {"intra_op_threads": torch.get_num_threads(), "inter_op_threads": torch.get_num_interop_threads(),
            "parallel_backend": _parallel_line(info, "ATen parallel backend") or "unknown",
            "omp_max_threads": _parallel_line(info, "omp_get_max_threads()") or "not built with OpenMP",
            "mkl_max_threads": _parallel_line(info, "mkl_get_max_threads()") or "not built with MKL",
            "env": {k: os.environ.get(k, "unset") for k in THREAD_ENV}}


def mapped_files(maps: Path = Path("/proc/self/maps")) -> set[str] | None:
    """The paths of the files this process has mapped, None where /proc is not readable."""
    try:
        return {line.split()[-1] for line in maps.read_text().splitlines() if "/" in line}
    except OSError:
        return None


def allocator(maps: Path = Path("/proc/self/maps")) -> str:
    """The malloc this process runs on: a preloaded jemalloc/tcmalloc/mimalloc among its mapped files, else glibc's."""
    mapped = mapped_files(maps)
    if mapped is None:
        return "unknown: /proc/self/maps is not readable"
    found = sorted(path for path in mapped if Path(path).name.startswith(ALLOCATOR_LIBS))
    return ", ".join(found) if found else "glibc malloc"


def gpu_driver() -> str:
    """The NVIDIA driver's version from nvidia-smi (or NVML through pynvml when nvidia-smi is absent)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as exc:  # pynvml absent, or NVML without a driver: say which
        return f"unknown: nvidia-smi gave nothing and NVML failed ({type(exc).__name__})"


def _amdgpu_driver() -> str:
    try:
        return "amdgpu " + Path("/sys/module/amdgpu/version").read_text().strip()
    except OSError:
        return "unknown: /sys/module/amdgpu/version is not readable"


def gpu() -> dict | str:
    """The GPU torch sees: name, count, memory, compute capability, driver and runtime; NO_GPU where none."""
    import torch

    if not torch.cuda.is_available():
        return NO_GPU
    props = torch.cuda.get_device_properties(0)
    hip = getattr(torch.version, "hip", None)
    return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1), "compute_capability": f"{props.major}.{props.minor}",
            "driver": _amdgpu_driver() if hip else gpu_driver(),
            "runtime": f"HIP {hip}" if hip else f"CUDA {torch.version.cuda}",
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}


def tree_digest(root: Path = REPO_ROOT) -> str:
    """A digest of the tracked sources' diff from HEAD (reports/ left out), '' on a clean tree."""
    try:
        diff = subprocess.run(["git", "-C", str(root), "diff", "HEAD", "--", ".", ":(exclude)reports"],
                              capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return hashlib.sha256(diff).hexdigest()[:16] if diff else ""


def fingerprint(device: str = "cpu") -> str:
    """A short id of the machine (CPU model and flags, CPUs, GPU where used): rows of two never share a table."""
    info = _cpuinfo()
    parts = [cpu_model(), info.get("cpu family", ""), info.get("model", ""), info.get("stepping", ""),
             str(os.cpu_count()), info.get("flags", ""), device_name(device) if device != "cpu" else ""]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def run_id() -> str:
    """SDPERF_RUN_ID, set by `sdperf run` for its notebooks; a notebook opened alone gets its own."""
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


def record(profile: str | None = None, device: str = "cpu", packages: tuple[str, ...] = ()) -> dict:
    """Everything a reader needs to judge a number taken here; `packages`: the techniques' own, beside PACKAGES."""
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
        "thread_settings": thread_settings(),
        "allocator": allocator(),
        "gpu": gpu(),
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(tuple(dict.fromkeys(PACKAGES + tuple(packages)))),
        "commit": git_commit(),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"},
        "time_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
