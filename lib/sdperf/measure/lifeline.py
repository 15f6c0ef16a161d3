"""No worker outlives the process that launched it, and a death says why.

Every worker and fork server asks for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG); a worker's pid file
(reports/<profile>/.workers/) lets the next `sdperf run` find survivors; a death names its signal and memory.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import re
import os
import signal
import subprocess
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LAUNCHER_ENV = "SDPERF_LAUNCHER_PID"
FOLDER = ".workers"


# ---------------------------------------------------------------- dying with the parent

def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask for `sig` when the parent dies; exit now if `parent` is already gone. False without prctl."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux
        return False
    if parent is not None and os.getppid() != parent:
        os._exit(128 + int(sig))
    return True


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _stat(pid).get("state") not in ("Z", "X", None)


def exit_if_orphaned(launcher: int | None) -> None:
    """In a worker: end now if the process that launched it has already died (before the death signal was set)."""
    if launcher is not None and not alive(launcher):
        os._exit(128 + signal.SIGKILL)


def preexec(parent: int):
    """A subprocess preexec_fn: the child dies with `parent`, its launcher."""
    def _child() -> None:
        die_with_parent(parent)
    return _child


# ---------------------------------------------------------------- pid files

def _stat(pid: int) -> dict:
    """State and start time (clock ticks after boot) of `pid` from /proc, {} when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return {}
    rest = text[text.rindex(")") + 2:].split()
    return {"state": rest[0], "start_ticks": int(rest[19])}


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


_PID_FILE = re.compile(r"[0-9]+\.json")  # registered()'s names: the only files survivors() may remove


def folder(profile: str) -> Path:
    from sdperf.core.paths import profile_reports

    return profile_reports(profile) / FOLDER


def _forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing fork server, when it has one (CPython keeps it privately)."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


@contextlib.contextmanager
def registered(profile: str, pid: int, spec: dict, server_pid: int | None = None):
    """A pid file for the worker `pid` and its fork server while the block runs; left behind only by a killed run."""
    path = folder(profile) / f"{pid}.json"
    procs = {"worker": pid}
    server = server_pid or _forkserver_pid()
    if server is not None:
        procs["fork server"] = server
    record = {"launcher": os.getpid(), "stack": spec.get("stack"), "batch_size": spec.get("batch_size"),
              "round": spec.get("round"), "run_id": os.environ.get("SDPERF_RUN_ID", ""),
              "started": time.time(),
              "processes": {k: {"pid": p, "start_ticks": _stat(p).get("start_ticks")} for k, p in procs.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    except OSError:  # a read-only reports folder must not stop a measurement; the prctl guard still holds
        path = None
    try:
        yield
    finally:
        if path is not None:
            path.unlink(missing_ok=True)


def survivors(profile: str) -> list[dict]:
    """One dict per process a killed launcher left running; pid files of processes all gone are removed."""
    from sdperf.core.paths import unsafe_folder

    out = []
    where = folder(profile)
    mine = where.is_dir() and unsafe_folder(where) is None  # through a link nothing is read or removed
    for path in sorted(p for p in where.glob("*.json") if _PID_FILE.fullmatch(p.name)) if mine else []:
        if path.is_symlink():  # a pid file is written here, never linked: the link goes, its target stays
            path.unlink(missing_ok=True)
            continue
        try:
            record = json.loads(path.read_text())
            live = _live(record)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):  # not a record registered() wrote
            path.unlink(missing_ok=True)
            continue
        if not live:
            path.unlink(missing_ok=True)
        out += [s for s in live if not s["launcher_alive"]]
    return out


def _live(record: dict) -> list[dict]:
    """The processes of a pid file's record that still run as the ones it registered (same start time)."""
    live = []
    for role, p in record["processes"].items():
        st = _stat(int(p["pid"]))
        if st and st["state"] not in ("Z", "X") and st["start_ticks"] == p.get("start_ticks"):
            live.append({"pid": int(p["pid"]), "role": role, "rss_mib": rss_mib(int(p["pid"])),
                         "stack": record.get("stack"), "batch_size": record.get("batch_size"),
                         "launcher": record.get("launcher"), "launcher_alive": alive(int(record["launcher"]))})
    return live


def describe(found: list[dict]) -> str:
    return "; ".join(f"pid {s['pid']} ({s['role']} of {s['stack']} at batch {s['batch_size']}, launched by pid "
                     f"{s['launcher']}, now gone): RSS "
                     + (f"{s['rss_mib']:,.0f} MiB" if s["rss_mib"] is not None else "unknown") for s in found)


# ---------------------------------------------------------------- why it died

def oom_kills() -> int | None:
    """This process's cgroup's oom_kill count (cgroup v2 memory.events), None where it cannot be read."""
    from sdperf.measure.memory import _cgroup_dirs

    for d in _cgroup_dirs():
        try:
            for line in (d / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def kernel_log_oom(pid: int | None) -> str | None:
    """The kernel log's line saying it killed `pid` for memory, where dmesg may be read (often it may not)."""
    if pid is None:
        return None
    try:
        text = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    hits = [ln for ln in text.splitlines() if f"Killed process {pid} " in ln or f"Killed process {pid}(" in ln]
    return hits[-1].strip() if hits else None


def signal_name(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"


def death_cause(code: int | None, pid: int | None = None, oom_before: int | None = None) -> str:
    """What ended a process that exited with `code`: its signal or exit code, and the system's word on memory."""
    if code is None:
        return "still running or never started"
    why = signal_name(code)
    after = oom_kills()
    log = kernel_log_oom(pid)
    if oom_before is not None and after is not None and after > oom_before:
        return f"{why}; out of memory: the cgroup's memory.events oom_kill rose {oom_before} -> {after}"
    if log:
        return f"{why}; out of memory: {log}"
    if code == -signal.SIGKILL:
        return f"{why}; out of memory? (the OOM killer sends SIGKILL; neither the cgroup nor the kernel log said)"
    return why
