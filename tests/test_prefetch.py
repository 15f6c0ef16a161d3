"""sdperf run measures the notebooks' stand-alone comparisons up front, in one schedule with a baseline every few
configurations, and each notebook reads its configurations back from the run's ledger instead of measuring again."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from sdperf.measure import ledger as ledgers
from sdperf.measure import rounds
from sdperf.run import prefetch
from sdperf.experiments import baseline, engine_export
from sdperf.core.paths import scratch_dir
from sdperf.measure.rounds import BASELINE, TWIN, Config
from sdperf.measure.study import open_study
from test_rounds import SlowingMachine

COSTS = {"fp32-eager": 1.0, "grad:inference_mode": 1.0, "grad:no_grad": 0.5, "grad:grad": 2.0,
         "grad:grad+parameters:trainable": 4.0, "scheduler:dpmpp-2m@20": 1.0, "scheduler:euler@25": 1.0,
         "scheduler:plms@25": 1.0, "deepcache:3": 0.5}


def test_a_long_round_gets_a_baseline_after_every_n_configurations():
    cs = [Config(f"c{i}", "grad:no_grad") for i in range(5)]
    seq = rounds.schedule(cs, 2, every=2)
    names = [c.name for _, c in seq]
    assert names[0] == BASELINE and names[-1] == BASELINE
    runs, gap = [], 0
    for n in names[1:]:
        if n == BASELINE:
            runs.append(gap)
            gap = 0
        else:
            gap += 1
    assert max(runs) == 2 and sum(runs) == 2 * 6  # 5 configurations and the twin, twice
    for r in (0, 1):  # every round holds every configuration once
        assert sorted(c.name for rr, c in seq if rr == r and c.name != BASELINE) == sorted([*(c.name for c in cs), TWIN])
    assert [c.name for _, c in rounds.schedule(cs[:2], 1)] == [BASELINE, "c0", "c1", TWIN, BASELINE]  # default


def test_the_plan_reads_each_notebooks_keys_from_the_profiles_one_list(smoke):
    assert [c.stack for c in prefetch.plan(smoke, ["04_torch_compile"])] == ["compile:regional"]
    cpu = replace(smoke, techniques=("compile:default", "tome:0.5", "compile:freezing"))
    assert [c.stack for c in prefetch.plan(cpu, ["04_torch_compile"])] == ["compile:default", "compile:freezing"]
    # 09: its first `own_processes` schedulers in processes of their own, the rest priced; and its caching
    # ... and the students, tiny decoder and guidance cuts it times in processes of their own
    assert [c.stack for c in prefetch.plan(smoke, ["09_fewer_steps"])] == ["scheduler:dpmpp-2m@20", "deepcache:3",
                                                                         "distill:lcm@2+decoder:tiny",
                                                                         "guidance:cutoff@0.5"]
    three = replace(smoke, notebooks={"09_fewer_steps": {"own_processes": 3}})
    assert [c.stack for c in prefetch.plan(three, ["09_fewer_steps"])] == [
        *[k for k in smoke.techniques if k.startswith("scheduler:")][:3], "deepcache:3", "distill:lcm@2+decoder:tiny",
        "guidance:cutoff@0.5"]
    # 10's search measures its parts up front too, whichever notebook owns them, and the method's calibration
    search = replace(smoke, techniques=("deepcache:3", "tome:0.3", "stages:openvino-f32", "scheduler:euler@10"))
    assert [c.stack for c in prefetch.plan(search, ["09_fewer_steps", "10_ladder"])] == [
        "scheduler:euler@10", "deepcache:3", "tome:0.3", "stages:openvino-f32", "calibration:unet-twice"]
    # ...and its allocator rung, whose workers fork from their allocator's server (the schedule's others too)
    rung = replace(smoke, techniques=("allocator:tcmalloc",), notebooks={"10_ladder": {"check_method": False}})
    assert [c.stack for c in prefetch.plan(rung, ["10_ladder"])] == ["allocator:tcmalloc"]
    odd = replace(smoke, techniques=("grad:no_grad", "scheduler:nope@3", "scheduler:euler@25", "deepcache:3"))
    got = [c.stack for c in prefetch.plan(odd, ["02_inference_mode", "09_fewer_steps", "13_serving"])]
    assert got == ["grad:no_grad", "scheduler:euler@25", "deepcache:3"]  # a bad key is the notebook's to report; a
    # notebook that compares nothing adds nothing


def _probe_at(speedup: float):
    from sdperf.measure import half_budget

    def probe(study, dtype):
        return half_budget.Probe(dtype, "down_blocks.0", speedup, speedup, speedup, 1e-3, 1.0, [0.01], [0.01 / speedup])
    return probe


@pytest.mark.parametrize("speedup, kept", [(0.03, False), (1.0, True)])
def test_a_search_precision_over_the_half_budget_is_not_measured_up_front(smoke, monkeypatch, speedup, kept):
    """On an AVX2 EPYC one bf16 worker of 10's search parts ran over 15 min per round: the rounds up front apply
    the rule the search applies (sdperf.measure.half_budget.skips), from the run's one block probe."""
    from sdperf.measure import half_budget

    asked = []
    probe = _probe_at(speedup)
    monkeypatch.setattr(half_budget, "probe", lambda study, dtype: asked.append(dtype) or probe(study, dtype))
    search = replace(smoke, variant_budget_s=100.0, techniques=("precision:bfloat16", "deepcache:3"),
                     notebooks={"10_ladder": {"check_method": False}})
    got = [c.stack for c in prefetch.plan(search, ["10_ladder"])]
    # fp32 takes 1 s per generation; smoke times 3 rounds x 4 generations: 400 s at 0.03x, 12 s at 1x
    assert got == (["precision:bfloat16", "deepcache:3"] if kept else ["deepcache:3"])
    assert asked == ["bfloat16"]
    asked.clear()  # a search without a precision asks for no probe (no pipeline built before the run)
    plain = replace(search, techniques=("deepcache:3",))
    assert [c.stack for c in prefetch.plan(plain, ["10_ladder"])] == ["deepcache:3"] and asked == []


def test_a_bad_key_beside_01s_precisions_is_left_to_the_notebook(smoke, monkeypatch):
    from sdperf.measure import half_budget

    monkeypatch.setattr(half_budget, "probe", _probe_at(1.0))
    odd = replace(smoke, techniques=("precision:bfloat16", "tome:nope"))
    assert [c.stack for c in prefetch.plan(odd, ["01_half_precision"])] == ["precision:bfloat16"]


def test_the_search_leaves_out_what_the_half_budget_skips(smoke, monkeypatch):
    """recipe.run asks the same rule before its parts are read back or measured, and returns why."""
    from sdperf.experiments import recipe
    from sdperf.measure import half_budget

    monkeypatch.setattr(half_budget, "probe", _probe_at(0.03))
    seen = {}

    class Stop(Exception):
        pass

    def parts(study, unets, stages, say=print):
        seen["unets"] = list(unets)
        raise Stop

    monkeypatch.setattr(recipe, "parts", parts)
    said = []
    study = SimpleNamespace(profile=replace(smoke, variant_budget_s=100.0))
    with pytest.raises(Stop):
        recipe.run(study, ["precision:bfloat16", "deepcache:3"], ["scheduler:euler@10"], [], max_quality=1,
                   say=said.append)
    assert seen["unets"] == ["deepcache:3"]
    assert any(s.startswith("precision:bfloat16: left out of the search, skipped: one UNet block") for s in said)


def test_a_notebook_compares_the_profiles_techniques_it_owns_whatever_its_parameters_are_called(smoke):
    """07 compares its UNet engines and, apart, the stages around the loop: both are its own keys in the profile's
    one list, found by their catalog records, not by the notebook's parameter names."""
    assert [c.stack for c in prefetch.plan(smoke, ["07_engine_export"])] == \
        [k for k in smoke.techniques if k.startswith(("engine:", "stages:"))]
    odd = replace(smoke, techniques=("engine:openvino-f32", "tome:0.5", "stages:openvino-int8w", "stages:nope"))
    assert [c.stack for c in prefetch.plan(odd, ["07_engine_export"])] == ["engine:openvino-f32",
                                                                           "stages:openvino-int8w"]
    assert [c.stack for c in prefetch.plan(odd, ["03_attention"])] == ["tome:0.5"]


def test_the_notebooks_read_back_what_the_run_measured_up_front(smoke, scratch_reports, monkeypatch):
    monkeypatch.setenv("SDPERF_RUN_ID", "run-prefetch")
    machine = SlowingMachine(COSTS, drift=0.01)
    full = replace(smoke, techniques=(  # cpu-full's: every grad mode, three schedulers in processes of their own
        "grad:inference_mode", "grad:no_grad", "grad:grad", "grad:grad+parameters:trainable", "scheduler:dpmpp-2m@20",
        "scheduler:euler@25", "scheduler:plms@25", "deepcache:3"), notebooks={"09_fewer_steps": {"own_processes": 3}})
    prefetch.run(full, ["02_inference_mode", "09_fewer_steps"], launcher=machine, say=lambda _m: None)
    up_front = len(machine.launched)
    configs = 8 + 1  # 02's four and 09's four (three schedulers, DeepCache), and the twin
    baselines = machine.launched.count("fp32-eager") - smoke.rounds  # the twin's processes run fp32 eager too
    assert up_front == smoke.rounds * configs + baselines
    assert baselines == 1 + smoke.rounds * -(-configs // prefetch.EVERY)  # fewer than a comparison each
    # 02 asks for its configurations under its own names: nothing is launched, the ratios are the truth's
    shared = scratch_dir(smoke.name) / "rounds" / ledgers.name("run-prefetch", smoke.name, smoke.rounds, None)
    m = rounds.run(smoke, [Config("no_grad", "grad:no_grad"), Config("grad on", "grad:grad")], rounds=smoke.rounds,
                   launcher=machine, say=lambda _m: None, ledger=shared)
    assert len(machine.launched) == up_front
    s = m.summary.set_index("config")
    for name, truth in (("no_grad", 2.0), ("grad on", 0.5), (TWIN, 1.0)):
        assert s.loc[name, "speedup_lo"] == pytest.approx(truth, rel=0.02)
        assert s.loc[name, "speedup_hi"] == pytest.approx(truth, rel=0.02)
    # 00 describes batch 1 from the run's fp32 processes instead of launching its own
    found = baseline._run_baselines(open_study("smoke", notebook="00_test"), 1)
    assert len(found) == baselines + smoke.rounds and set(found["stack"]) == {"fp32-eager"}
    assert baseline._run_baselines(open_study("smoke", notebook="00_test"), 2).empty


class EngineMachine(SlowingMachine):
    """The simulated machine, where every worker also hands back the same generation (no engine moves the
    latents) and the launches are counted per batch size."""

    def __call__(self, spec, **kw):
        result, _ = super().__call__(spec, **kw)
        self.launched[-1] = (spec["stack"], spec["batch_size"])
        return result, SimpleNamespace(latents=torch.ones(1, 4, 8, 8), images=torch.ones(1, 3, 64, 64))


def test_07s_batch_sweep_is_measured_up_front_where_00_finds_its_batches_too(smoke, scratch_reports, monkeypatch):
    monkeypatch.setenv("SDPERF_RUN_ID", "run-sweep")
    engines = ["engine:onnxruntime-fp32", "engine:openvino-f32"]
    stages = ["stages:openvino-f32"]  # the fastest configuration here, but not a UNet engine: never swept
    machine = EngineMachine({"fp32-eager": 1.0, "engine:onnxruntime-fp32": 0.8, "engine:openvino-f32": 0.5,
                             "stages:openvino-f32": 0.25}, 0.0)
    R, gens = smoke.rounds, 1 + max(smoke.warmup - 1, 0) + smoke.repeats

    def estimate(b):  # 07's rule, scaled from batch 1: baselines, the twin and the engine (build 1 s, set-up 0.1 s)
        one = 1.1 + b * gens * 1.0
        return (R + 1) * one + R * (one + 1.1 + b * gens * 0.5)
    budget = (estimate(2) + estimate(4)) / 2  # batch 2 fits, batch 4 does not
    profile = replace(smoke, techniques=tuple(engines + stages),
                      notebooks={"07_engine_export": {"sweep_batch_sizes": [1, 2, 4], "sweep_budget_s": budget}})
    prefetch.run(profile, ["00_baseline", "07_engine_export"], launcher=machine, say=lambda _m: None)
    at = {b: [s for s, bb in machine.launched if bb == b] for b in (1, 2, 4)}
    assert at[4] == [] and at[2].count("engine:openvino-f32") == R  # the fastest engine that keeps the latents
    assert at[1].count("stages:openvino-f32") == R  # measured up front beside the engines
    assert set(at[2]) == {"fp32-eager", "engine:openvino-f32"} and at[2].count("fp32-eager") > R  # baselines, twin

    def boom(*_a, **_k):
        raise AssertionError("a notebook launched a worker the run had measured up front")
    monkeypatch.setattr(rounds, "launch", boom)
    study = open_study("smoke", notebook="07_test")
    cmp = engine_export.compare_engines(study, engines)
    best = engine_export.best_engine(cmp)
    assert best == "engine:openvino-f32"
    swept = engine_export.batch_sweep(study, cmp, best, [1, 2, 4], budget).set_index("batch_size")
    assert list(swept.status) == ["ok", "ok", "skipped"]
    assert swept.loc[2, "unet_step_speedup"] == pytest.approx(2.0)
    staged = engine_export.stage_summary(engine_export.compare_stages(study, stages)).set_index("key")
    assert staged.loc["stages:openvino-f32", "speedup"] == pytest.approx(4.0)
    found = baseline._run_baselines(open_study("smoke", notebook="00_test"), 2)
    assert len(found) == at[2].count("fp32-eager") and baseline._run_baselines(study, 4).empty
