"""The arithmetic of a run of rounds, with a simulated machine: order, interpolation, noise band, verdicts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdperf.measure import rounds, worker
from sdperf.measure.rounds import BASELINE, TWIN, Config


def test_schedule_brackets_every_round_with_baselines_and_rotates_the_order():
    a, b = Config("a", "grad:no_grad"), Config("b", "grad:grad")
    seq = rounds.schedule([a, b], 3)
    names = [c.name for _, c in seq]
    assert names == [BASELINE, "a", "b", TWIN, BASELINE, "b", TWIN, "a", BASELINE, TWIN, "a", "b", BASELINE]
    with pytest.raises(ValueError):
        rounds.schedule([a], 0)
    assert {c.batch_size for _, c in rounds.schedule([Config("c", "grad:grad", 2)], 1)} == {2}  # baseline too
    with pytest.raises(ValueError, match="one batch size"):
        rounds.schedule([a, Config("c", "grad:grad", 2)], 1)


class SlowingMachine:
    """A fake launcher: every configuration has a true cost; the machine slows by `drift` per second of
    (simulated) wall time, and each worker's timed calls take 10 simulated seconds."""

    def __init__(self, costs: dict[str, float], drift: float, jitter: float = 0.0, seed: int = 0, t0: float = 0.0):
        self.costs, self.drift, self.t, self.t0 = costs, drift, t0, t0
        self.launched: list[str] = []
        self.rng = np.random.default_rng(seed)
        self.jitter = jitter

    def __call__(self, spec, **_kw):
        start, self.t = self.t, self.t + 10.0
        self.launched.append(spec["stack"])
        cost = self.costs[spec["stack"]] * (1 + self.drift * (start - self.t0 + 5.0)) * (1 + self.jitter * self.rng.standard_normal())
        result = {"status": "ok", "latency_s": cost, "unet_step_s": cost / 4, "s_per_image_seed": cost * 12,
                  "t_start": start, "t_end": self.t, "build_s": 1.0, "setup_s": 0.1, "first_call_s": cost,
                  "s_per_image": cost, "s_per_image_composed": cost, "peak_memory_mib": 100.0,
                  "process_peak_mib": 120.0, "setup_peak_mib": 110.0, "seed_unet_calls": 51, "iterations": 4,
                  "facts": {}}
        return result, None


def test_a_machine_that_slows_down_over_time_does_not_move_a_ratio(smoke):
    costs = {"fp32-eager": 1.0, "grad:no_grad": 0.5, "grad:grad": 2.0}
    machine = SlowingMachine(costs, drift=0.01)  # 1% slower every second: +50% over the run
    m = rounds.run(smoke, [Config("fast", "grad:no_grad"), Config("slow", "grad:grad")], rounds=3,
                   launcher=machine, say=lambda _m: None)
    assert machine.t * machine.drift > 1  # the machine really drifted: over twice as slow at the end
    s = m.summary.set_index("config")
    for name, truth in (("fast", 2.0), ("slow", 0.5), (TWIN, 1.0)):
        for ratio in ("speedup", "unet_step_speedup", "seed_speedup"):
            assert s.loc[name, f"{ratio}_lo"] == pytest.approx(truth, rel=0.02), (name, ratio)
            assert s.loc[name, f"{ratio}_hi"] == pytest.approx(truth, rel=0.02), (name, ratio)
    # the naive ratio against the first baseline would have been far off
    first = m.raw[m.raw.config == BASELINE].latency_s.iloc[0]
    last_fast = m.raw[m.raw.config == "fast"].latency_s.iloc[-1]
    assert first / last_fast < 0.8 * 2.0


def test_noise_band_is_symmetric_and_verdicts_need_the_whole_range_to_clear_it():
    lo, hi = rounds.noise_band([0.97, 1.02, 1.01])
    assert lo == pytest.approx(0.97) and hi == pytest.approx(1 / 0.97)
    band = (lo, hi)
    assert rounds.speed_verdict(1.05, 1.2, band) == rounds.FASTER
    assert rounds.speed_verdict(1.02, 1.2, band) == rounds.NOISE  # its low end is inside the band
    assert rounds.speed_verdict(0.5, 0.9, band) == rounds.SLOWER
    assert rounds.speed_verdict(1.5, 2.0, (float("nan"), float("nan"))) == rounds.NOISE


def test_noisy_identical_configurations_are_within_noise_and_a_real_gain_clears_it(smoke):
    machine = SlowingMachine({"fp32-eager": 1.0, "grad:no_grad": 1.0, "grad:grad": 0.6}, drift=0.0, jitter=0.03,
                             seed=3)
    m = rounds.run(smoke, [Config("same", "grad:no_grad"), Config("gain", "grad:grad")], rounds=5,
                   launcher=machine, say=lambda _m: None)
    s = m.summary.set_index("config")
    assert s.loc["same", "speedup_verdict"] == rounds.NOISE
    assert s.loc["gain", "speedup_verdict"] == rounds.FASTER


def test_a_failed_configuration_is_not_launched_again(smoke):
    calls = []

    def launcher(spec, **_kw):
        calls.append(spec["stack"])
        if spec["stack"] == "grad:grad":
            return {"status": "failed", "note": "RuntimeError: planted"}, None
        return SlowingMachine({spec["stack"]: 1.0}, 0.0)(spec)

    m = rounds.run(smoke, [Config("broken", "grad:grad")], rounds=3, launcher=launcher, say=lambda _m: None)
    assert calls.count("grad:grad") == 1
    row = m.summary.set_index("config").loc["broken"]
    assert row.status == "failed" and "planted" in row.note


def test_names_must_be_unique(smoke):
    with pytest.raises(ValueError, match="unique"):
        rounds.run(smoke, [Config("x", "grad:grad"), Config("x", "grad:no_grad")], launcher=None)


def test_alone_runs_each_configuration_once_per_round_in_a_rotated_order(smoke):
    """00's baseline sweep: no baseline or twin added, every batch size in its own process each round."""
    machine = SlowingMachine({"fp32-eager": 1.0}, drift=0.0)
    seen = []

    def launcher(spec, **kw):
        seen.append((spec["round"], spec["batch_size"]))
        return machine(spec, **kw)

    configs = [Config(f"b{b}", "fp32-eager", b) for b in (1, 2, 4)]
    raw = rounds.alone(smoke, configs, rounds=3, launcher=launcher, say=lambda _m: None)
    assert seen == [(0, 1), (0, 2), (0, 4), (1, 2), (1, 4), (1, 1), (2, 4), (2, 1), (2, 2)]
    assert sorted(raw.groupby("config").size().tolist()) == [3, 3, 3]
    assert set(raw.batch_size) == {1, 2, 4} and (raw.status == "ok").all()


def test_nothing_applicable_runs_the_baseline_alone_and_claims_no_noise_floor(smoke):
    """CUDA graphs on a CPU: nothing to compare, so no twin; the baseline still runs once per round."""
    machine = SlowingMachine({"fp32-eager": 1.0}, drift=0.0)
    launched = []

    def launcher(spec, **kw):
        launched.append(spec["stack"])
        return machine(spec, **kw)

    m = rounds.run(smoke, [Config("graphs", "cuda_graphs")], rounds=3, launcher=launcher, say=lambda _m: None)
    assert launched == ["fp32-eager"] * 3
    assert TWIN not in set(m.raw.config) and all(np.isnan(v[0]) for v in m.noise.values())
    s = m.summary.set_index("config")
    assert s.loc["graphs", "status"] == "not_applicable" and s.loc[BASELINE, "rounds"] == 3


def test_comparisons_of_one_run_share_its_baselines_twin_and_measured_configurations(smoke, tmp_path):
    """The second comparison of a run measures only what is new: no twin, no opening baseline, and a technique
    the first one measured is read back with the same rounds; its ratios still come out right."""
    import time

    costs = {"fp32-eager": 1.0, "grad:no_grad": 0.5, "grad:grad": 2.0, "attention:classic": 1.25}
    machine = SlowingMachine(costs, drift=0.002, t0=time.time())
    quiet = dict(rounds=3, launcher=machine, say=lambda _m: None, ledger=tmp_path / "ledger")
    first = rounds.run(smoke, [Config("fast", "grad:no_grad"), Config("slow", "grad:grad")], **quiet)
    assert machine.launched.count("fp32-eager") == 3 + 4  # twin x3, baseline x4
    machine.launched.clear()
    second = rounds.run(smoke, [Config("no_grad again", "grad:no_grad"), Config("classic", "attention:classic")],
                        **quiet)
    # only the new technique, 3 rounds, each closed by a baseline; the run's last baseline opens it
    assert machine.launched == ["attention:classic", "fp32-eager"] * 3
    s = second.summary.set_index("config")
    assert s.loc["no_grad again", "rounds"] == 3
    assert s.loc["no_grad again", "speedup"] == first.summary.set_index("config").loc["fast", "speedup"]
    assert s.loc["classic", "speedup"] == pytest.approx(0.8, rel=0.02)
    assert second.noise == first.noise  # the run's one noise floor
    machine.launched.clear()
    rounds.run(smoke, [Config("fast", "grad:no_grad")], **quiet)
    assert machine.launched == []  # everything asked is already measured


def test_a_ledger_skips_a_line_cut_short_and_keeps_concurrent_writers_rows(tmp_path):
    import multiprocessing

    from sdperf.measure.ledger import Ledger

    book = Ledger(tmp_path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(tmp_path, w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with open(tmp_path / "records.jsonl", "a") as fh:
        fh.write('{"role": "config", "stack": "cut')  # a writer killed mid-line
    recs = book.records()
    assert len(recs) == 2 * 200
    assert {(r["writer"], r["i"]) for r in recs} == {(w, i) for w in range(2) for i in range(200)}
    assert book.records(batch_size=2) == []


def _append_many(root, writer: int) -> None:
    from sdperf.measure.ledger import Ledger

    book = Ledger(root)
    for i in range(200):
        book.append({"role": "config", "stack": "grad:grad", "batch_size": 1, "round": 0, "status": "ok",
                     "writer": writer, "i": i, "pad": "x" * 5000})


def test_a_loop_only_worker_gets_the_baseline_decode_interpolated_to_its_time():
    """Workers that skipped the VAE decode (decoded False) add the baseline's, interpolated in wall time; the UNet
    step is untouched and rows timed whole are left as they were."""
    import pandas as pd

    raw = pd.DataFrame([
        dict(config=BASELINE, status="ok", t_start=0, t_end=10, latency_s=20.0, p10_s=20.0, p90_s=20.0,
             s_per_image=10.0, s_per_image_seed=100.0, s_per_image_composed=10.0, unet_step_s=3.0, decoded=True,
             vae_decode_s=4.0),
        dict(config="engine", status="ok", t_start=10, t_end=20, latency_s=12.0, p10_s=11.0, p90_s=13.0,
             s_per_image=6.0, s_per_image_seed=50.0, s_per_image_composed=6.0, unet_step_s=2.0, decoded=False,
             vae_decode_s=None),
        dict(config=TWIN, status="ok", t_start=20, t_end=30, latency_s=20.0, p10_s=20.0, p90_s=20.0,
             s_per_image=10.0, s_per_image_seed=100.0, s_per_image_composed=10.0, unet_step_s=3.0, decoded=True,
             vae_decode_s=4.0),
        dict(config=BASELINE, status="ok", t_start=30, t_end=40, latency_s=22.0, p10_s=22.0, p90_s=22.0,
             s_per_image=11.0, s_per_image_seed=110.0, s_per_image_composed=11.0, unet_step_s=3.0, decoded=True,
             vae_decode_s=6.0),
    ])
    out = rounds.with_baseline_decode(raw, batch_size=2).set_index("config")
    vae = 4.0 + (6.0 - 4.0) * (15 - 5) / (35 - 5)  # the baselines' decode at the engine's midpoint
    assert out.loc["engine", "latency_s"] == pytest.approx(12.0 + vae)
    assert out.loc["engine", "p90_s"] == pytest.approx(13.0 + vae)
    assert out.loc["engine", "s_per_image"] == pytest.approx(6.0 + vae / 2)
    assert out.loc["engine", "s_per_image_seed"] == pytest.approx(50.0 + vae / 2)
    assert out.loc["engine", "unet_step_s"] == 2.0
    assert out.loc[TWIN, "latency_s"] == 20.0
    assert rounds.with_baseline_decode(raw.drop(columns="decoded"), 2).equals(raw.drop(columns="decoded"))


def test_workers_start_from_allocator_servers_only_when_a_runnable_configuration_needs_another_allocator(
        smoke, monkeypatch):
    """An allocator this machine lacks is not applicable: it must not send every other worker of the run through
    fork servers of their own settings (a new interpreter each, ~7 s of imports) for nothing; one that runs does,
    baselines included, so all are started alike."""
    from sdperf.optimizations import allocator

    def run_with(available: bool) -> set:
        monkeypatch.setattr(allocator, "find_library", lambda _s: Path("/lib/libjemalloc.so.2") if available else None)
        machine, starts = SlowingMachine({"fp32-eager": 1.0, "grad:grad": 1.0, "allocator:jemalloc": 1.0}, 0.0), set()

        def launcher(spec, **kw):
            starts.add(kw["allocator_server"])
            return machine(spec, **kw)

        rounds.run(smoke, [Config("grad", "grad:grad"), Config("jemalloc", "allocator:jemalloc")], rounds=3,
                   launcher=launcher, say=lambda _m: None)
        return starts

    assert run_with(False) == {False}
    assert run_with(True) == {True}


def test_a_worker_takes_the_launchers_sdperf_settings_not_the_fork_servers(smoke, monkeypatch):
    """The fork server keeps the environment of the moment it started: a worker adopts the launcher's SDPERF_*
    variables from its spec (a stale params folder made every later worker fail to find its profile)."""
    import os

    from sdperf.measure import worker

    monkeypatch.setenv("SDPERF_PARAMS_DIR", "/launcher/params")
    monkeypatch.delenv("SDPERF_PROFILE", raising=False)
    spec = rounds._spec(smoke, Config.of("grad:no_grad"), 0, None, {})
    assert spec["env"]["SDPERF_PARAMS_DIR"] == "/launcher/params" and "SDPERF_PROFILE" not in spec["env"]
    monkeypatch.setenv("SDPERF_PARAMS_DIR", "/stale/params")  # what a fork server started earlier would hold
    monkeypatch.setenv("SDPERF_PROFILE", "stale")
    worker._adopt(spec["env"])
    assert os.environ["SDPERF_PARAMS_DIR"] == "/launcher/params" and "SDPERF_PROFILE" not in os.environ


def test_a_caching_worker_composes_its_per_image_time_from_both_call_kinds(smoke):
    """DeepCache's calls alternate full and cached: the per-image time at 50 steps counts each kind at its own
    median and in the pattern it runs at 50 steps, not the cheap kind's median times every call."""
    result, _ = worker.measure({"profile": "smoke", "stack": "deepcache:2"})
    assert result["status"] == "ok", result
    kinds, counts = result["unet_kind_s"], result["seed_call_kinds"]
    assert set(kinds) == {"full", "cached"} and sum(counts.values()) == result["seed_unet_calls"] == 51
    assert counts["full"] == 25  # PLMS at 50 steps: 51 calls, the repeated timestep cached, every second one full
    per_call = (counts["full"] * kinds["full"] + counts["cached"] * kinds["cached"]) / 51
    assert result["unet_step_s"] == pytest.approx(per_call)
    assert result["s_per_image_seed"] > 51 * min(kinds.values())


def test_only_a_killed_worker_is_suspected_of_running_out_of_memory():
    assert rounds.death_note(-9).startswith("worker died (signal 9 (SIGKILL); out of memory? (the OOM killer")
    assert rounds.death_note(-6, "free(): invalid pointer") == ("worker died (signal 6 (SIGABRT)) "
                                                                 "free(): invalid pointer")
    assert rounds.death_note(1, "ValueError: x") == "worker died (exit code 1) ValueError: x"


class KilledAt(SlowingMachine):
    """A simulated machine whose launcher process is SIGKILLed when it starts its `kill_at`-th worker: what a user's
    Ctrl-\\ or the OOM killer does to `sdperf run` between two workers."""

    def __init__(self, costs, kill_at: int | None = None, **kw):
        super().__init__(costs, drift=0.0, **kw)
        self.kill_at, self.rounds = kill_at, []

    def __call__(self, spec, **kw):
        import os
        import signal

        if self.kill_at is not None and len(self.launched) + 1 == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.rounds.append((spec["stack"], spec["round"]))
        return super().__call__(spec, **kw)


def _sitting(smoke, ledger, sitting: str, machine, configs):
    import os

    os.environ["SDPERF_RUN_ID"] = sitting
    return rounds.run(smoke, configs, rounds=3, launcher=machine, say=lambda _m: None, ledger=ledger)


@pytest.mark.parametrize("kill_at", [6, 7], ids=["between rounds", "inside a round"])
def test_a_killed_run_resumes_at_its_first_unfinished_round_with_each_rounds_own_baselines(smoke, tmp_path,
                                                                                             monkeypatch, kill_at):
    """Sitting 1 is SIGKILLed as it launches its 6th worker (round 0 whole, round 1 not begun) or its 7th (one
    configuration of round 1 written): sitting 2 measures rounds 1 and 2 only, in full. Sitting 2's machine is
    1.5x slower throughout, so a ratio dividing by the other sitting's baseline would be off by 1.5x."""
    import multiprocessing

    monkeypatch.setenv("SDPERF_RUN_ID", "unused")
    costs = {"fp32-eager": 1.0, "grad:no_grad": 0.5, "grad:grad": 2.0}
    configs = [Config("fast", "grad:no_grad"), Config("slow", "grad:grad")]
    ledger = tmp_path / "ledger"
    child = multiprocessing.get_context("fork").Process(
        target=_sitting, args=(smoke, ledger, "sitting-1", KilledAt(costs, kill_at), configs))
    child.start()
    child.join(120)
    assert child.exitcode == -9  # really killed, by SIGKILL: nothing after the kill ran
    slower = KilledAt({k: 1.5 * v for k, v in costs.items()}, t0=1e6)
    m = _sitting(smoke, ledger, "sitting-2", slower, configs)
    measured = [(s, r) for s, r in slower.rounds if s != "fp32-eager"]
    assert sorted(measured) == sorted((s, r) for s in ("grad:no_grad", "grad:grad") for r in (1, 2))
    assert sum(s == "fp32-eager" for s, _ in slower.rounds) == 2 + 3  # the twin's rounds 1-2, and 3 baselines
    s = m.summary.set_index("config")
    for name, truth in (("fast", 2.0), ("slow", 0.5), (TWIN, 1.0)):
        assert s.loc[name, "rounds"] == 3
        assert s.loc[name, "speedup_lo"] == pytest.approx(truth, rel=1e-6), name
        assert s.loc[name, "speedup_hi"] == pytest.approx(truth, rel=1e-6), name
    per_round = m.ratios.set_index(["config", "round"]).baseline_latency_s
    assert per_round.loc[("fast", 0)] == pytest.approx(1.0) and per_round.loc[("fast", 2)] == pytest.approx(1.5)
    assert m.sittings == 2 and "rounds from 2 sittings" in m.method
    again = KilledAt(costs)
    assert _sitting(smoke, ledger, "sitting-3", again, configs).sittings == 2 and again.launched == []


def test_a_ledger_counts_an_earlier_sittings_records_only_up_to_its_last_whole_round(tmp_path):
    from sdperf.measure.ledger import Ledger

    first = Ledger(tmp_path, sitting="s1")
    for role, r in (("baseline", 0), ("config", 0), ("baseline", 1)):
        first.append({"role": role, "stack": "x", "batch_size": 1, "round": r, "status": "ok"})
    first.close_round(0, 1)
    first.append({"role": "config", "stack": "x", "batch_size": 1, "round": 1, "status": "ok"})  # then killed
    assert len(first.records()) == 4  # its own sitting sees everything it wrote
    later = Ledger(tmp_path, sitting="s2")
    assert [(r["role"], r["round"]) for r in later.records()] == [("baseline", 0), ("config", 0), ("baseline", 1)]
    assert later.sittings() == ["s1"]
