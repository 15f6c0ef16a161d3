"""A busy machine is measured, refused or marked (sdperf.measure.contention, issue 61): one other busy core once made
fp32 eager 78x slower and published an engine as 38x faster at rc 0."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.measure import contention, rounds, timing
from sdperf.measure.comparison import _marked
from sdperf.measure.rounds import BASELINE, TWIN, Config
from sdperf.run import runner


@pytest.fixture
def busy():
    """A process spinning on this test's CPUs (it inherits the affinity) for as long as the test runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def share(monkeypatch):
    monkeypatch.setenv(contention.SHARE_ENV, "0.2")
    monkeypatch.setattr(contention, "QUIET_WAIT_S", 1.0)
    return 0.2


def test_others_time_is_what_the_cpus_did_less_this_process_and_steal_counts_too(monkeypatch):
    monkeypatch.setattr(os, "sysconf", lambda _name: 100)
    a = contention.Sample(busy=1000, steal=0, total=2000, own_s=5.0, at=0.0)
    b = contention.Sample(busy=1150, steal=20, total=2200, own_s=6.0, at=1.0)  # 2 s of CPU time in all
    taken = contention.between(a, b)
    assert taken["others_share"] == pytest.approx((1.5 - 1.0) / 2.0)  # 1.5 s busy, 1 s of it ours
    assert taken["steal_share"] == pytest.approx(0.2 / 2.0)
    assert taken["share"] == pytest.approx(0.7 / 2.0)
    assert contention.between(a, None) is None and contention.between(b, a) is None


@pytest.mark.parametrize("raw", ["0", "-0.1", "1.5", "abc", "nan", "inf"])
def test_a_bad_share_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv(contention.SHARE_ENV, raw)
    with pytest.raises(ConfigError, match=rf"{contention.SHARE_ENV}=.*in \(0, 1\]"):
        contention.threshold()


def test_a_busy_process_on_the_same_cpus_is_seen_by_the_timed_calls(busy, share):
    """What a worker does, in this process: the spinning neighbour takes a large share of the timed window."""
    x = torch.randn(256, 256)
    t = timing.measure(lambda: [x @ x for _ in range(200)], device="cpu", warmup=1, repeats=5)
    assert t.contention is not None and t.contention["window_s"] > 0
    assert t.contention["share"] > share, t.contention
    assert contention.contended(t.contention) and "other processes took" in contention.words(t.contention)


def test_sdperf_run_refuses_a_busy_machine_naming_the_busiest_process(busy, share):
    with pytest.raises(ConfigError, match=rf"the machine is busy: .*pid {busy.pid} .*--beside-load"):
        runner.check_quiet(beside=False, say=lambda _m: None)
    said = []
    taken = runner.check_quiet(beside=True, say=said.append)
    assert taken["share"] > share and any("--beside-load" in s for s in said)


def test_a_share_of_one_never_samples_and_never_refuses(busy, monkeypatch):
    monkeypatch.setenv(contention.SHARE_ENV, "1")
    monkeypatch.setattr(contention, "machine_now", lambda *_a: pytest.fail("sampled"))
    assert runner.check_quiet(beside=False) is None


def test_a_second_run_anywhere_on_the_machine_is_refused_at_once(tmp_path, monkeypatch):
    """Two `sdperf run` of different profiles once took 222 s each against ~30 s alone, rc 0."""
    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "elsewhere"))
    with contention.machine_lock("profile cpu, reports /somewhere/else"):
        with pytest.raises(ConfigError, match=r"another `sdperf run` is measuring on this machine \(pid \d+, "
                                              r"profile cpu, reports /somewhere/else"):
            runner.run("smoke", only=["00"])
    with contention.machine_lock("again"):  # released when the holder ends
        pass


class LoadedMachine:
    """A launcher whose workers report the load their timed calls saw: `loaded` {(stack, round): share}."""

    def __init__(self, loaded: dict):
        self.loaded, self.launched, self.t = loaded, [], 0.0

    def __call__(self, spec, **_kw):
        self.launched.append((spec["stack"], spec["round"]))
        start, self.t = self.t, self.t + 1.0
        share = self.loaded.get((spec["stack"], spec["round"]), 0.01)
        result = {"status": "ok", "note": "", "latency_s": 1.0, "unet_step_s": 0.1, "s_per_image_seed": 1.0,
                  "t_start": start, "t_end": self.t, "build_s": 1.0, "setup_s": 0.1, "first_call_s": 1.0,
                  "s_per_image": 1.0, "s_per_image_composed": 1.0, "peak_memory_mib": 100.0,
                  "process_peak_mib": 120.0, "setup_peak_mib": 110.0, "seed_unet_calls": 51, "iterations": 4,
                  "facts": {}, "contention": {"others_share": share, "steal_share": 0.0, "share": share,
                                              "window_s": 1.0}}
        return result, None


def test_a_reached_worker_is_measured_again_and_one_still_reached_marks_its_ratios(smoke, share, monkeypatch):
    monkeypatch.setattr(contention, "wait_quiet", lambda **_kw: None)
    machine = LoadedMachine({("grad:no_grad", 1): 0.6})  # reached both times it is launched in round 1
    said = []
    m = rounds.run(smoke, [Config("fast", "grad:no_grad"), Config("other", "grad:grad")], rounds=3,
                   launcher=machine, say=said.append)
    assert machine.launched.count(("grad:no_grad", 1)) == 1 + rounds.BESIDE_LOAD_RETRIES
    assert any("measured again once the machine is quiet" in s for s in said)
    assert any("still other processes took 60%" in s for s in said)
    assert set(m.beside_load) == {"fast"} and "1 of 3 round(s)" in m.beside_load["fast"]
    rows = _marked([{"scenario": "fast, batch 1", "note": "per image"}, {"scenario": "other, batch 1", "note": "x"}],
                   m.beside_load, ", batch 1")
    assert contention.BESIDE_LOAD in rows[0]["note"] and rows[0]["note"].startswith("per image; ")
    assert rows[1]["note"] == "x"


def test_a_reached_baseline_marks_every_configuration_of_its_round_and_the_twin_the_noise_floor(smoke, share,
                                                                                               monkeypatch):
    monkeypatch.setattr(contention, "wait_quiet", lambda **_kw: None)
    monkeypatch.setattr(rounds, "BESIDE_LOAD_RETRIES", 0)
    machine = LoadedMachine({("fp32-eager", 2): 0.5})  # every fp32 eager worker of round 2: baselines and twin
    m = rounds.run(smoke, [Config("fast", "grad:no_grad")], rounds=3, launcher=machine, say=lambda _m: None)
    assert {"fast", BASELINE, TWIN} <= set(m.beside_load)
    rows = _marked([{"scenario": "noise floor, batch 1", "note": ""}], m.beside_load, ", batch 1")
    assert rows[0]["note"].startswith(contention.BESIDE_LOAD)


def test_a_quiet_run_marks_nothing(smoke, share):
    m = rounds.run(smoke, [Config("fast", "grad:no_grad")], rounds=3, launcher=LoadedMachine({}),
                   say=lambda _m: None)
    assert m.beside_load == {}


def test_the_baselines_own_description_is_measured_again_and_marked_too(smoke, share, monkeypatch):
    """00 describes fp32 eager from processes of its own (rounds.alone): the same re-measure and mark."""
    monkeypatch.setattr(contention, "wait_quiet", lambda **_kw: None)
    machine = LoadedMachine({("fp32-eager", 0): 0.7})  # round 0 reached both times
    raw = rounds.alone(smoke, [Config("fp32 eager, batch 1", "fp32-eager")], rounds=3, launcher=machine,
                       say=lambda _m: None)
    assert machine.launched.count(("fp32-eager", 0)) == 1 + rounds.BESIDE_LOAD_RETRIES and len(raw) == 3
    said = rounds.reached_words(raw)
    assert said.startswith(f"{contention.BESIDE_LOAD} in 1 of 3 process(es)") and "70%" in said
    assert rounds.reached_words(raw[raw["round"] > 0]) == ""
