"""The ladder: stand-alone rows found by catalog key (this machine and commit only), how the best order is chosen,
how the stacks are planned, and the gain over the rung below taken round by round."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

from sdperf.measure import rounds
from sdperf.select import standalone
from sdperf.measure.comparison import BASELINE
from sdperf.core.errors import ConfigError
from sdperf.experiments import ladder
from sdperf.optimizations import catalog
from sdperf.store.results import Recorder
from sdperf.measure.study import open_study


def _env(machine="this-cpu", commit="abc123", time_utc="2025-01-01T00:00:00"):
    return {"device": "cpu", "device_name": "cpu", "cpu_model": "x", "machine": machine, "threads": 2,
            "commit": commit, "run_id": "r", "packages": {"torch": "2"}, "python": "3.11",
            "time_utc": time_utc}


def _store(rec: Recorder, key: str, speedup: float, verdict: str, *, name: str | None = None, psnr=None):
    """The rows comparison.record writes for one stand-alone configuration (display name free, key exact)."""
    scenario = f"{name or 'anything ' + key}, batch 1"
    common = dict(key=key, method="m", batch_size=1)
    rows = [dict(scenario=scenario, metric="latency", value=1.0 / speedup, unit="s", **common),
            dict(scenario=scenario, metric="speedup_vs_fp32", value=speedup, unit="x", lo=speedup * 0.98,
                 hi=speedup * 1.02, verdict=verdict, note="per image at the profile's steps", **common),
            dict(scenario=scenario, metric="unet_step_speedup_vs_fp32", value=speedup, unit="x", lo=speedup,
                 hi=speedup, verdict=verdict, note="per UNet step", **common)]
    if psnr is not None:
        rows.append(dict(scenario=scenario, metric="image_psnr_db", value=psnr, unit="dB", **common))
    rec.add_many(rows)


def test_standalone_finds_every_catalog_technique_by_key_on_this_machine_and_commit_only(scratch_reports):
    here = _env()
    keys = catalog.keys()
    assert {"grad:inference_mode", "deepspeed:inject", "cuda_graphs"} <= set(keys)
    for i, key in enumerate(keys):
        tech = catalog.get(key)
        _store(Recorder(tech.notebook, "smoke", here), key, 1.1 + i / 100, "faster")
    # the same keys measured later on another CPU, or at another commit, must not be read
    for env in (_env(machine="other-cpu", time_utc="2026"), _env(commit="older", time_utc="2026")):
        for key in ("grad:inference_mode", "deepspeed:inject", "cuda_graphs"):
            _store(Recorder(catalog.get(key).notebook, "smoke", env), key, 9.0, "faster", name="elsewhere")
    # a row of the right key in another notebook (a ladder rung, say) is not the stand-alone row
    _store(Recorder("10_ladder", "smoke", here), "cuda_graphs", 7.0, "faster", name="Cerebrium order 5")
    study = SimpleNamespace(recorder=Recorder("10_ladder", "smoke", here))
    t = standalone.standalone(study).set_index("key")
    assert list(t.index) == keys and (t.status == "ok").all()
    for i, key in enumerate(keys):
        assert t.loc[key, "speedup"] == pytest.approx(1.1 + i / 100), key
        assert t.loc[key, "speedup_verdict"] == "faster"
        assert t.loc[key, "speedup_lo"] < t.loc[key, "speedup"] < t.loc[key, "speedup_hi"]
        assert t.loc[key, "notebook"] == catalog.get(key).notebook
    assert t.loc["deepspeed:inject", "scenario"] == "anything deepspeed:inject, batch 1"


def test_standalone_says_not_measured_and_keeps_a_failed_rows_reason(scratch_reports):
    rec = Recorder("05_cuda_graphs", "smoke", _env())
    rec.add("CUDA graph, batch 1", "latency", None, "", status="not_applicable", note="not applicable: no GPU",
            key="cuda_graphs", batch_size=1)
    study = SimpleNamespace(recorder=rec)
    t = standalone.standalone(study, ["cuda_graphs", "grad:no_grad"]).set_index("key")
    assert t.loc["cuda_graphs", "status"] == "not_applicable" and "no GPU" in t.loc["cuda_graphs", "note"]
    assert t.loc["grad:no_grad", "status"] == "not measured" and pd.isna(t.loc["grad:no_grad", "speedup"])


def _alone(rows):
    """A stand-alone table: (key, status, speedup, verdict, quality verdict on the reference model) with the
    catalog's family and declarations."""
    out = []
    for key, status, speedup, verdict, quality in rows:
        t = catalog.get(key)
        out.append({"key": key, "technique": t.label, "family": t.family, "notebook": t.notebook, "status": status,
                    "speedup": speedup, "speedup_lo": speedup, "speedup_hi": speedup, "speedup_verdict": verdict,
                    "seed_speedup": speedup, "seed_speedup_lo": speedup, "seed_speedup_hi": speedup,
                    "seed_speedup_verdict": verdict,
                    "image_psnr_db": 60.0, "changes_output": t.changes_output, "quality_verdict": quality,
                    "adherence_delta": None})
    return pd.DataFrame(out)


def test_best_order_one_per_family_executor_last_fastest_first_faster_only_and_keeping_the_picture():
    t = _alone([
        ("compile:default", "ok", 1.5, "faster", None),
        ("engine:openvino-f32", "ok", 1.4, "faster", None),          # a slower executor
        ("int8:torch-ao-dynamic", "ok", 3.0, "faster", "over budget"),  # fastest, but over the quality budget
        ("attention:sdpa:math", "ok", 1.05, "faster", None),
        ("grad:no_grad", "ok", 1.2, "faster", None),
        ("grad:inference_mode", "ok", 1.1, "faster", None),           # a slower one of the same family
        ("precision:bfloat16", "ok", 1.3, "within noise", "within budget"),  # median above 1, range inside noise
        ("precision:float16", "ok", 2.0, "faster", "within budget"),  # changes the output, cost within budget
        ("scheduler:dpmpp-2m@20", "ok", 2.5, "faster", "undecided"),  # an interval straddles the budget
        ("deepcache:3", "ok", 2.2, "faster", None),                   # lossy and never judged: not kept
        ("calibration:unet-twice", "ok", 4.0, "faster", None),        # a check of the method, never a rung
        ("cuda_graphs", "not_applicable", None, None, None),
    ])
    order, why = ladder.best_order(t)
    assert order == ["precision:float16", "grad:no_grad", "attention:sdpa:math", "compile:default"]
    reasons = dict(zip(why.key, why.why))
    assert reasons["int8:torch-ao-dynamic"] == "changes the picture: over budget"
    assert reasons["scheduler:dpmpp-2m@20"] == "changes the picture: undecided"
    assert reasons["deepcache:3"] == "changes the picture: no quality measurement on the reference model"
    assert reasons["engine:openvino-f32"].startswith("a faster technique of its family")
    assert reasons["grad:inference_mode"].startswith("a faster technique of its family")
    assert "within noise" in reasons["precision:bfloat16"]
    assert reasons["cuda_graphs"] == "not_applicable in 05_cuda_graphs"
    assert reasons["calibration:unet-twice"].startswith("a check of the method")
    lossy, _ = ladder.best_order(t, allow_lossy=True)
    assert lossy == ["scheduler:dpmpp-2m@20", "deepcache:3", "precision:float16", "grad:no_grad",
                     "attention:sdpa:math", "int8:torch-ao-dynamic"]
    Stack = catalog.Stack  # every chosen order must be a valid stack (one of a family)
    assert Stack.of(catalog.join(order)).key == "+".join(order)


def test_best_order_chooses_by_the_per_image_ratio_at_50_steps_not_at_the_timed_steps():
    """At 8001efb the stage engines read faster per image at the profile's 2 steps (text encoder and VAE decode
    weigh 17x more there) and within noise at the seeds' 50: they entered the best order and their rung came out
    0.69x over the rung below. The per-image ratio at 50 steps decides, and orders."""
    t = _alone([
        ("precision:bfloat16", "ok", 2.14, "faster", "within budget"),
        ("stages:openvino-int8w", "ok", 1.07, "faster", "within budget"),
        ("grad:no_grad", "ok", 1.10, "faster", None),
    ])
    at_50 = {"stages:openvino-int8w": (1.04, 0.97, 1.04, "within noise"), "grad:no_grad": (3.0, 2.9, 3.1, "faster")}
    for key, (v, lo, hi, verdict) in at_50.items():
        t.loc[t.key == key, ["seed_speedup", "seed_speedup_lo", "seed_speedup_hi", "seed_speedup_verdict"]] = [
            v, lo, hi, verdict]
    order, why = ladder.best_order(t)
    assert order == ["grad:no_grad", "precision:bfloat16"]  # no_grad first: faster at 50 steps, slower at 2
    reason = dict(zip(why.key, why.why))["stages:openvino-int8w"]
    assert reason.startswith("not faster than fp32 alone per image at 50 steps: 1.040x [0.970-1.040]"), reason


@pytest.mark.parametrize("engine_speedup,kept,dropped", [(1.90, "int8:openvino-nncf-weights", "deepcache:2"),
                                                          (1.60, "deepcache:2", "int8:openvino-nncf-weights")])
def test_best_order_keeps_an_engine_or_feature_caching_whichever_is_faster_alone(engine_speedup, kept, dropped):
    """The cpu run at 524c39a chose bf16 + DeepCache 2 + tcmalloc + NNCF int8 weights and its last rung failed:
    an engine runs a trace of the UNet, and DeepCache's Python around the blocks cannot ride along."""
    t = _alone([
        ("precision:bfloat16", "ok", 2.21, "faster", "within budget"),
        ("deepcache:2", "ok", 1.74, "faster", "within budget"),
        ("int8:openvino-nncf-weights", "ok", engine_speedup, "faster", "within budget"),
        ("allocator:tcmalloc", "ok", 1.21, "faster", None),
    ])
    order, why = ladder.best_order(t)
    assert kept in order and dropped not in order and order[0] == "precision:bfloat16"
    reason = dict(zip(why.key, why.why))[dropped]
    assert reason.startswith(f"cannot stack with {kept}") and "the larger speed-up alone was kept" in reason
    assert catalog.Stack.of(catalog.join(order)).key == "+".join(order)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDPERF_REPORTS_DIR", str(tmp_path_factory.mktemp("reports")))
        yield open_study("smoke", notebook="10_ladder")


def test_cerebrium_plan_on_cpu_replaces_the_grad_mode_and_leaves_gpu_rungs_out(study):
    lad = ladder.plan(study, ladder.CEREBRIUM, ladder.CEREBRIUM_ORDER,
                      skips={"precision:float16": "too slow here"})
    r = {x.key: x for x in lad.rungs}
    assert r["grad:no_grad"].stack == "grad:no_grad" and r["grad:no_grad"].below == BASELINE
    assert r["precision:float16"].status == "skipped" and r["precision:float16"].note == "skipped: too slow here"
    # inference_mode replaces no_grad (same family); fp16 was skipped, so it is not under it
    assert r["grad:inference_mode"].stack == "grad:inference_mode"
    assert "replaces grad:no_grad" in r["grad:inference_mode"].note
    assert r["grad:inference_mode"].below == r["grad:no_grad"].name
    for key in ("deepspeed:inject", "cuda_graphs"):
        assert r[key].status == "not_applicable" and r[key].note.startswith("not applicable: ")
    unskipped = {x.key: x for x in ladder.plan(study, "x", ladder.CEREBRIUM_ORDER).rungs}
    assert unskipped["grad:inference_mode"].stack == "precision:float16+grad:inference_mode"
    with pytest.raises(ConfigError, match="unknown technique 'warp-drive'"):
        ladder.plan(study, "x", ["warp-drive"])


def _fake_comparison(per_round: dict[str, list[float]], band=(0.97, 1.03)):
    """A Comparison's shape: per-round speed-ups of each config, the summary rows, the noise band."""
    ratios = pd.DataFrame([{"config": c, "round": r, "speedup": v, "unet_step_speedup": v, "seed_speedup": v}
                           for c, vs in per_round.items() for r, v in enumerate(vs)])
    rows = {BASELINE: {"status": "ok", "rounds": 3, "s_per_image": 1.0}}
    for c, vs in per_round.items():
        s = pd.Series(vs)
        rows[c] = {"status": "ok", "rounds": len(vs), "speedup": s.median(), "speedup_lo": s.min(),
                   "speedup_hi": s.max(), "speedup_verdict": rounds.speed_verdict(s.min(), s.max(), band),
                   "verdict": "bit-identical"}
    return SimpleNamespace(measured=SimpleNamespace(ratios=ratios), noise={"speedup": band}, method="m",
                           row=lambda name: rows.get(name))


def test_gain_over_the_rung_below_is_taken_round_by_round(study):
    lad = ladder.plan(study, "L", ["grad:no_grad", "attention:sdpa:math"])
    one, two = (r.name for r in lad.rungs)
    # the machine is slower in round 1: both rungs' ratios move together, their quotient does not
    cmp = _fake_comparison({one: [1.20, 1.50, 1.20], two: [1.32, 1.65, 1.32]})
    t = ladder.ladder_table(cmp, lad).set_index("rung")
    assert t.loc[2, "vs_rung_below"] == pytest.approx(1.1)
    assert t.loc[2, "vs_lo"] == pytest.approx(1.1) and t.loc[2, "vs_hi"] == pytest.approx(1.1)
    assert t.loc[2, "vs_verdict"] == "faster"  # the ratio of medians' ranges (1.32/1.5 .. 1.65/1.2) would not be
    assert t.loc[1, "vs_rung_below"] == pytest.approx(1.2) and t.loc[1, "below"] == BASELINE
    assert t.loc[0, "technique"] == BASELINE and t.loc[0, "speedup"] == 1.0
    shown = ladder.show_table([dataclasses.replace(lad, table=ladder.ladder_table(cmp, lad))])
    assert shown.loc[shown.rung == 2, "vs_rung_below"].item() == pytest.approx(1.1)


def test_best_recipe_is_the_fastest_rung_that_clears_the_noise(study):
    lad = ladder.plan(study, "L", ["grad:no_grad", "attention:sdpa:math"])
    one, two = (r.name for r in lad.rungs)
    lad.table = ladder.ladder_table(_fake_comparison({one: [1.2, 1.25, 1.3], two: [0.9, 1.5, 1.1]}), lad)
    best = ladder.best_recipe(lad)
    assert best["key"] == "grad:no_grad" and best["per_image_speedup"] == pytest.approx(1.25)
    lad.table = ladder.ladder_table(_fake_comparison({one: [1.0, 1.01, 0.99], two: [0.9, 1.0, 1.1]}), lad)
    assert ladder.best_recipe(lad)["recipe"] == "fp32 eager (nothing beat it)"


def test_allocator_rung_takes_allocator_keys_only(study):
    with pytest.raises(ConfigError, match="not allocator settings: grad:no_grad"):
        ladder.allocator_rung(study, ["allocator:jemalloc", "grad:no_grad"])


def test_no_allocator_runs_nothing_and_leaves_no_allocator_to_stack(study, monkeypatch):
    from sdperf.experiments import recipe

    def boom(*_a, **_k):
        raise AssertionError("an empty allocator rung launched rounds of its own")
    monkeypatch.setattr(ladder, "run_variants", boom)
    alloc = ladder.allocator_rung(study, [])
    assert alloc.empty and list(alloc.columns) == ladder.ALLOCATOR_COLUMNS
    assert recipe.faster_allocators(alloc) == []


def test_measure_runs_every_rung_in_one_call_and_stores_rows_the_report_shows(study, monkeypatch):
    from sdperf.report import report

    cere = ladder.plan(study, ladder.CEREBRIUM, ["grad:no_grad", "attention:sdpa:math", "cuda_graphs"])
    best = ladder.plan(study, ladder.BEST, ["attention:sdpa:math"])
    calls = []

    def fake_run_variants(_study, items, **_kw):
        calls.append(items)
        return _fake_comparison({name: [1.2, 1.3, 1.25] for name, _ in items})

    monkeypatch.setattr(ladder, "run_variants", fake_run_variants)
    ladder.measure(study, [cere, best], say=lambda _m: None)
    assert len(calls) == 1 and [k for _, k in calls[0]] == ["grad:no_grad", "grad:no_grad+attention:sdpa:math",
                                                            "attention:sdpa:math", ladder.METHOD_CHECK]
    rows = study.recorder.table()
    graphs = rows[rows.scenario.str.contains("CUDA graph")]
    assert graphs.status.tolist() == ["not_applicable"]
    assert graphs.key.tolist() == ["grad:no_grad+attention:sdpa:math+cuda_graphs"]
    below = rows[rows.metric == "speedup_vs_rung_below"].set_index("key")
    assert below.loc["grad:no_grad+attention:sdpa:math", "value"] == pytest.approx(1.0)
    assert "within noise" in below.loc["grad:no_grad+attention:sdpa:math", "note"]
    assert "faster" in below.loc["grad:no_grad", "note"] and (below.method == "m").all()
    page = report.write_index(study.profile.name).read_text()
    assert "<h2 id='ladder'>The ladder</h2>" in page
    assert page.index("id='ladder'") < page.index("id='environment'")
    assert "Cerebrium order 3: CUDA graph" in page and "not applicable: " in page


def test_the_ladders_and_the_searchs_stacks_share_one_schedule_and_the_search_reads_them_back(tmp_path, monkeypatch):
    """measure_with runs both ladders' rungs and the search's chosen stacks in one rounds schedule (one set of fp32
    baselines); the search's verify then launches nothing and records the stacks' rows itself."""
    from sdperf.experiments import recipe

    monkeypatch.setenv("SDPERF_REPORTS_DIR", str(tmp_path / "reports"))
    study = open_study("smoke", notebook="10_ladder")
    launched, clock = [], [0.0]

    def machine(spec, **_kw):  # a simulated worker: the stack's cost, 10 s of wall time each
        clock[0] += 10.0
        launched.append(spec["stack"])
        cost = {"grad:no_grad": 0.8, "attention:sdpa:math": 0.9}.get(spec["stack"], 1.0)
        return {"status": "ok", "latency_s": cost, "unet_step_s": cost / 4, "s_per_image_seed": cost * 12,
                "t_start": clock[0] - 10.0, "t_end": clock[0], "build_s": 1.0, "setup_s": 0.1, "first_call_s": cost,
                "s_per_image": cost, "s_per_image_composed": cost, "peak_memory_mib": 100.0,
                "process_peak_mib": 120.0, "setup_peak_mib": 110.0, "seed_unet_calls": 51, "iterations": 4,
                "facts": {}}, None

    monkeypatch.setattr(rounds, "launch", machine)
    decided = {"cerebrium": ladder.plan(study, ladder.CEREBRIUM, ["grad:no_grad"]),
               "best": ladder.plan(study, ladder.BEST, ["attention:sdpa:math"]), "choice": None, "order": []}
    chosen = {"best admissible stack": "grad:no_grad+attention:sdpa:math"}
    with pytest.raises(ValueError, match="both the ladders and the search"):
        ladder.measure_with(study, decided, {ladder.CHECK_NAME: "grad:no_grad"}, say=lambda _m: None)
    out = ladder.measure_with(study, decided, chosen, check=False, say=lambda _m: None)
    n = study.profile.rounds
    stacks = ["grad:no_grad", "attention:sdpa:math", "grad:no_grad+attention:sdpa:math"]
    assert [launched.count(s) for s in stacks] == [n, n, n]
    assert launched.count(rounds.BASELINE_KEY) == 2 * n + 1  # n baselines and n twins, one closing baseline
    assert out["comparison"].row(out["best"].rungs[0].name)["status"] == "ok"
    rows = study.recorder.table()
    assert not rows.scenario.str.startswith("best admissible stack").any()  # the search's rows are the search's
    before = len(launched)
    whole = recipe.verify(study, chosen, say=lambda _m: None)
    assert len(launched) == before and whole.row("best admissible stack")["status"] == "ok"  # read back
    assert study.recorder.table().scenario.str.startswith("best admissible stack").any()


def test_an_allocator_enters_the_searchs_stacks_when_faster_per_image_at_50_steps():
    from sdperf.experiments import recipe

    alloc = pd.DataFrame([{"key": "allocator:tcmalloc", "speedup_verdict": "within noise",
                           "seed_speedup_verdict": "faster"},
                          {"key": "allocator:jemalloc", "speedup_verdict": "faster",
                           "seed_speedup_verdict": "within noise"}])
    assert recipe.faster_allocators(alloc) == ["allocator:tcmalloc"]
