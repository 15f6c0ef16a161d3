"""No worker outlives its run (sdperf.measure.lifeline, issue 32): a launcher killed with SIGKILL takes its worker (and the
fork server it came from) with it; a survivor a killed run left is named, with its RSS, before the next run
measures; a death names its signal and, when the system says so, memory."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sdperf
from sdperf.measure import lifeline, rounds
from sdperf.run import runner
from sdperf.core.errors import ConfigError
from sdperf.measure.rounds import Config

# Starts one worker the way sdperf.measure.rounds does (rounds.launch), on the smoke profile, with repeats enough to keep
# it measuring for minutes, then waits for it: the test kills this process while the worker runs.
LAUNCHER = r"""
import sys
from sdperf.measure import rounds
from sdperf.config.profiles import load_profile
from sdperf.measure.rounds import Config
spec = rounds._spec(load_profile("smoke", check_runtime=False), Config(rounds.BASELINE), 0, None,
                    {"warmup": 1, "repeats": 1000000})
rounds.launch(spec, allocator_server=sys.argv[1] == "allocator-server")
"""


def _wait_for(what, check, timeout: float, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


@pytest.mark.parametrize("mode", ["forkserver", "allocator-server"])
def test_a_launcher_killed_with_sigkill_leaves_no_worker(mode, scratch_reports):
    env = dict(os.environ, SDPERF_REPORTS_DIR=str(scratch_reports), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(sdperf.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, mode], env=env)
    pid_files = scratch_reports / "smoke" / lifeline.FOLDER
    try:
        # the pid file appears once the worker started; the worker then builds the pipeline and times it
        path = _wait_for("the worker's pid file", lambda: next(iter(pid_files.glob("*.json")), None), 240)
        record = json.loads(path.read_text())
        assert record["launcher"] == launcher.pid
        procs = {role: p["pid"] for role, p in record["processes"].items()}
        assert lifeline.alive(procs["worker"]) and lifeline.alive(procs["fork server"])
        time.sleep(1.0)  # the worker is past its start-up checks
        assert lifeline.alive(procs["worker"])
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    _wait_for("the worker and its fork server to die", lambda: not any(map(lifeline.alive, procs.values())), 10)
    # the next run finds nothing left and removes the stale pid file
    assert lifeline.survivors("smoke") == [] and not path.exists()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_next_run_names_a_survivor_and_refuses_beside_it(scratch_reports):
    orphan = subprocess.Popen(["sleep", "60"])
    try:
        folder = lifeline.folder("smoke")
        folder.mkdir(parents=True)
        start = lifeline._stat(orphan.pid)["start_ticks"]
        (folder / f"{orphan.pid}.json").write_text(json.dumps({
            "launcher": _dead_pid(), "stack": "fp32-eager", "batch_size": 1, "round": 0,
            "processes": {"worker": {"pid": orphan.pid, "start_ticks": start}}}))
        found = lifeline.survivors("smoke")
        assert [s["pid"] for s in found] == [orphan.pid] and found[0]["rss_mib"] > 0
        with pytest.raises(ConfigError, match=rf"pid {orphan.pid} \(worker of fp32-eager at batch 1.*RSS .* MiB"
                                               rf".*kill {orphan.pid}.*--beside-survivors"):
            runner.check_survivors("smoke")
        said = []
        assert runner.check_survivors("smoke", beside=True, say=said.append) == found
        assert str(orphan.pid) in said[0]
    finally:
        orphan.kill()
        orphan.wait()
    assert lifeline.survivors("smoke") == [] and not list(lifeline.folder("smoke").glob("*.json"))


def test_a_pid_reused_by_another_process_is_no_survivor(scratch_reports):
    """A pid file whose pid now belongs to a process started later (another start time) names nothing."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        folder = lifeline.folder("smoke")
        folder.mkdir(parents=True)
        (folder / f"{other.pid}.json").write_text(json.dumps({
            "launcher": _dead_pid(), "stack": "fp32-eager", "batch_size": 1,
            "processes": {"worker": {"pid": other.pid, "start_ticks": lifeline._stat(other.pid)["start_ticks"] - 1}}}))
        assert lifeline.survivors("smoke") == []
    finally:
        other.kill()
        other.wait()


def test_a_worker_killed_by_a_signal_says_which(smoke):
    """A real worker, SIGKILLed while it measures: its failed row names the signal (and memory only as the
    OOM killer's signal, or as the system's word)."""
    spec = rounds._spec(smoke, Config(rounds.BASELINE), 0, None, {"warmup": 1, "repeats": 1000000})
    killer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time, json, glob, signal\n"
        "d = sys.argv[1]\n"
        "end = time.time() + 240\n"
        "while time.time() < end and not glob.glob(d + '/*.json'): time.sleep(0.2)\n"
        "time.sleep(1)\n"
        "f = glob.glob(d + '/*.json')[0]\n"
        "os.kill(json.load(open(f))['processes']['worker']['pid'], signal.SIGKILL)\n"),
        str(lifeline.folder(smoke.name))])
    try:
        result, _ = rounds.launch(spec, timeout_s=300)
    finally:
        killer.wait(30)
    assert result["status"] == "failed"
    assert "signal 9 (SIGKILL)" in result["note"] and "out of memory" in result["note"]


def test_death_cause_names_signals_exit_codes_and_the_systems_word_on_memory(monkeypatch):
    monkeypatch.setattr(lifeline, "kernel_log_oom", lambda pid: None)
    monkeypatch.setattr(lifeline, "oom_kills", lambda: 2)
    assert lifeline.death_cause(-6, oom_before=2) == "signal 6 (SIGABRT)"
    assert lifeline.death_cause(3) == "exit code 3"
    assert lifeline.death_cause(-9, oom_before=2).startswith("signal 9 (SIGKILL); out of memory? (the OOM killer")
    assert lifeline.death_cause(-9, oom_before=1) == ("signal 9 (SIGKILL); out of memory: the cgroup's "
                                                      "memory.events oom_kill rose 1 -> 2")
    monkeypatch.setattr(lifeline, "kernel_log_oom", lambda pid: "Out of memory: Killed process 42 (python)")
    assert lifeline.death_cause(-9, pid=42) == ("signal 9 (SIGKILL); out of memory: Out of memory: Killed process "
                                                "42 (python)")
