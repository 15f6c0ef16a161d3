"""The memory allocator as a rung: on a CPU, part of what other backends "win" is page faults that eager PyTorch
pays under glibc's default malloc; tuning glibc's thresholds, or preloading jemalloc / tcmalloc, removes them.

An allocator is chosen before Python starts (environment variables, LD_PRELOAD): an `allocator:<setting>` key runs
in workers forked from a fork server started under that setting (sdperf.measure.allocator_servers).
"""
from __future__ import annotations

import ctypes.util
import os
import platform
from pathlib import Path

from sdperf.core.environment import mapped_files
from sdperf.optimizations.catalog import ALLOCATOR, Technique

# glibc: keep big blocks on the heap instead of fresh mmaps, and never hand memory back between calls.
GLIBC_TUNED = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "68719476736",
               "MALLOC_TOP_PAD_": "1073741824"}
# (library, Debian package): tcmalloc's minimal build (no heap profiler), the one PyTorch's CPU tuning guides preload
PRELOADS = {"jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
            "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4")}
SETTINGS = ("default", "glibc-tuned") + tuple(PRELOADS)
# oneTBB (OpenVINO's threading) dlopens hwloc with RTLD_DEEPBIND, so hwloc frees with glibc what a preloaded malloc
# gave it (SIGABRT on the first compile_model); TBB_ENABLE_SANITIZERS=1 makes oneTBB load it without RTLD_DEEPBIND.
PRELOAD_EXTRA = {"TBB_ENABLE_SANITIZERS": "1"}
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def _check(setting: str) -> None:
    if setting not in SETTINGS:
        raise ValueError(f"allocator {setting!r} is not valid; choose one of: {', '.join(SETTINGS)}")


def find_library(setting: str) -> Path | None:
    """The shared library a preload setting needs, where the system keeps it."""
    name = PRELOADS[setting][0]
    for folder in _LIB_DIRS:
        path = Path(folder) / name
        if path.is_file():
            return path
    found = ctypes.util.find_library(name.split(".so")[0].removeprefix("lib"))
    return Path(found) if found and Path(found).is_absolute() else None


def availability(setting: str) -> tuple[bool, str]:
    _check(setting)
    if setting == "default":
        return True, "the process's allocator as started"
    if platform.system() != "Linux":
        return False, f"{setting} is set through glibc/LD_PRELOAD, which this study only drives on Linux"
    if setting == "glibc-tuned":
        if not platform.libc_ver()[0] == "glibc":
            return False, "the C library here is not glibc, so MALLOC_* thresholds mean nothing to it"
        return True, "glibc malloc with " + " ".join(f"{k}={v}" for k, v in GLIBC_TUNED.items())
    lib = find_library(setting)
    if lib is None:
        name, package = PRELOADS[setting]
        return False, f"{name} is not installed (Debian/Ubuntu: apt-get install {package})"
    return True, f"LD_PRELOAD={lib}"


def environment(setting: str, base: dict | None = None) -> dict:
    """The environment a fresh process needs for `setting`: the caller's, minus any allocator setting it had."""
    ok, reason = availability(setting)
    if not ok:
        raise ValueError(f"allocator {setting!r} cannot be used here: {reason}")
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not (k.startswith("MALLOC_") or k == "LD_PRELOAD" or k in PRELOAD_EXTRA)}
    if setting == "glibc-tuned":
        env.update(GLIBC_TUNED)
    elif setting in PRELOADS:
        env["LD_PRELOAD"] = str(find_library(setting))
        env.update(PRELOAD_EXTRA)
    return env


def techniques() -> list[Technique]:
    """allocator:<setting>: the worker process is started under that allocator (it cannot change later)."""
    return [Technique(f"allocator:{s}", f"allocator {s}", ALLOCATOR, "10_ladder", allocator=s,
                      availability=lambda ctx, s=s: availability(s),
                      note="set before Python starts: environment variables or LD_PRELOAD")
            for s in SETTINGS if s != "default"]


def in_effect(setting: str, maps: Path = Path("/proc/self/maps")) -> bool | None:
    """Whether this process runs under `setting` (its library mapped, glibc's thresholds set, or for default no
    preload mapped); None where the process map cannot be read. A row shows the setting took hold."""
    _check(setting)
    if setting == "glibc-tuned":
        return all(os.environ.get(k) == v for k, v in GLIBC_TUNED.items())
    paths = mapped_files(maps)
    if paths is None:
        return None
    mapped = {Path(p).name for p in paths}

    def has(lib: str) -> bool:  # the map names the file a symlink resolves to: libtcmalloc_minimal.so.4.5.10
        return any(name == lib or name.startswith(lib + ".") for name in mapped)

    if setting == "default":
        return not any(has(lib) for lib, _ in PRELOADS.values())
    return has(PRELOADS[setting][0])
