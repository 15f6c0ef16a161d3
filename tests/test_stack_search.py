"""The stack search: composed speed from measured parts, the quality budget, the Pareto front."""
from __future__ import annotations

import pandas as pd
import pytest

from sdperf.select import stack_search as ss
from sdperf.optimizations import feature_reuse
from sdperf.judge.techniques import OVER, UNDECIDED, WITHIN
from sdperf.measure.rounds import BASELINE


def _stages(te=0.5, unet=2.0, sched=0.001):
    return [{"stage": "text_encoder", "seconds_per_image_call": te, "median_call_s": te},
            {"stage": "unet", "seconds_per_image_call": 3 * unet, "median_call_s": unet},
            {"stage": "scheduler", "seconds_per_image_call": 3 * sched, "median_call_s": sched}]


def test_a_candidate_is_composed_from_its_parts_and_caching_counts_each_call_kind():
    ts = [float(t) for t in range(981, 0, -20)]  # 50 distinct timesteps
    row = {"stages": _stages(), "vae_decode_s": 1.0}
    assert ss.composed_s(row, None, ts, None) == pytest.approx(0.5 + 50 * 2.0 + 50 * 0.001 + 1.0)
    cached = dict(row, unet_kind_s={"full": 2.0, "cached": 0.5})
    kinds = lambda t: feature_reuse.call_kinds(list(t), 5)  # noqa: E731
    assert ss.composed_s(cached, None, ts, kinds) == pytest.approx(0.5 + 10 * 2.0 + 40 * 0.5 + 50 * 0.001 + 1.0)
    engine = {"stages": _stages(te=0.1), "vae_decode_s": 0.25}  # a stage engine brings its own encoder and decoder
    assert ss.composed_s(row, engine, ts, None) == pytest.approx(0.1 + 50 * 2.0 + 50 * 0.001 + 0.25)


def test_composed_speed_divides_each_rounds_baseline_and_reports_the_range():
    raw = pd.DataFrame([
        {"config": BASELINE, "round": r, "status": "ok", "stages": _stages(), "vae_decode_s": 1.0,
         "s_per_image_seed": 100.0} for r in range(3)] + [
        {"config": "int8", "round": r, "status": "ok", "stages": _stages(unet=u), "vae_decode_s": 1.0}
        for r, u in enumerate((0.4, 0.5, 0.6))])
    ratios = pd.DataFrame({"config": ["int8"] * 3, "round": [0, 1, 2], "baseline_s_per_image_seed": [100.0] * 3})
    ts = list(range(25))
    got = ss.composed_speed(raw, ratios, {ss.BASELINE_KEY: BASELINE, "int8:openvino-nncf-ptq": "int8"},
                            ss.Candidate("int8:openvino-nncf-ptq", "scheduler:euler@25"), ts)
    per = [0.5 + 25 * u + 25 * 0.001 + 1.0 for u in (0.4, 0.5, 0.6)]
    assert got["status"] == "ok" and got["rounds"] == 3 and got["unet_calls"] == 25
    assert got["speedup"] == pytest.approx(100 / per[1])
    assert (got["speedup_lo"], got["speedup_hi"]) == pytest.approx((100 / per[2], 100 / per[0]))
    missing = ss.composed_speed(raw, ratios, {ss.BASELINE_KEY: BASELINE}, ss.Candidate("deepcache:3"), ts)
    assert missing["status"] == "not measured"


def test_candidates_hold_one_technique_per_family_and_know_what_is_lossless():
    c = ss.candidates(["engine:openvino-f32", "deepcache:3"], ["scheduler:euler@20"], ["stages:openvino-f32"])
    keys = {x.key for x in c}
    assert len(c) == 3 * 2 * 2  # (eager or either UNet side) x (PLMS-50 or Euler) x (PyTorch or engine stages)
    assert "engine:openvino-f32+stages:openvino-f32+scheduler:euler@20" in keys and "deepcache:3" in keys
    assert ss.Candidate("engine:openvino-f32", "", "stages:openvino-f32").lossless
    assert ss.Candidate("engine:openvino-f32").lossless and not ss.Candidate("", "scheduler:euler@20").lossless
    assert not ss.unet_side("scheduler:euler@20") and ss.unet_side("int8:openvino-nncf-ptq")


def _table(rows):
    return pd.DataFrame([{"key": ss.Candidate(*parts).key, "candidate": ss.Candidate(*parts), "speedup": s,
                          "speedup_lo": lo, "speedup_hi": hi} for parts, s, lo, hi in rows])


PTQ = "int8:openvino-nncf-ptq"


def test_a_stack_over_the_budget_is_never_chosen_however_fast():
    table = _table([((PTQ, "scheduler:dpmpp-2m@10"), 20.0, 19.0, 21.0),  # its sampler alone is over budget
                    ((PTQ, "scheduler:euler@15"), 15.0, 14.0, 16.0),   # parts within, the stack judged over
                    ((PTQ, "scheduler:euler@20"), 12.0, 11.0, 13.0),   # undecided whole
                    ((PTQ, "scheduler:euler@25"), 10.0, 9.5, 10.5),    # within, parts and whole
                    (("engine:openvino-f32",), 1.4, 1.3, 1.5),         # lossless
                    (("", "scheduler:euler@10"), 1.02, 0.99, 1.05)])   # within noise
    asked = []
    verdicts = {f"{PTQ}+scheduler:euler@15": OVER, f"{PTQ}+scheduler:euler@20": UNDECIDED,
                f"{PTQ}+scheduler:euler@25": WITHIN, "scheduler:plms@50": OVER}  # the lossless one's pictures
    parts = {PTQ: WITHIN, "scheduler:dpmpp-2m@10": OVER, "scheduler:euler@15": WITHIN, "scheduler:euler@20": WITHIN,
             "scheduler:euler@25": WITHIN}

    def judge(keys):
        asked.extend(keys)
        return pd.DataFrame([{"key": k, "quality_verdict": verdicts[k], "adherence_delta": -0.001} for k in keys])

    found = ss.search(table, (0.97, 1.03), judge, parts, max_quality=10, batch=2)
    assert f"{PTQ}+scheduler:dpmpp-2m@10" not in asked  # its scheduler alone is over budget
    best = ss.best(found)
    assert best.key == f"{PTQ}+scheduler:euler@25"
    t = found.set_index("key")
    assert t.loc[f"{PTQ}+scheduler:dpmpp-2m@10", "admissible"] == ss.PRUNED
    assert "scheduler:dpmpp-2m@10 alone is over budget" in t.loc[f"{PTQ}+scheduler:dpmpp-2m@10", "why"]
    assert t.loc[f"{PTQ}+scheduler:euler@15", "admissible"] == ss.INADMISSIBLE
    assert t.loc[f"{PTQ}+scheduler:euler@20", "admissible"] == ss.INADMISSIBLE
    assert t.loc["scheduler:euler@10", "speed_verdict"] == "within noise"
    assert ss.best(found, lossless=True).key == "engine:openvino-f32"
    # with a rendering budget too small to reach an admissible stack, nothing is chosen
    asked.clear()
    short = ss.search(table, (0.97, 1.03), judge, parts, max_quality=1, batch=1)
    assert ss.best(short) is None and [k for k in asked if k != "scheduler:plms@50"] == [f"{PTQ}+scheduler:euler@15"]


def test_a_lossless_candidates_quality_is_plms50s_own_read_back_never_zero():
    """Its pictures are fp32 PLMS-50's: against the converged solve it carries that sampler's deficit, from the
    seeds' sampler's rows (read back, not counted as a rendering), so no 0 sits beside PLMS-50's interval."""
    table = _table([(("engine:openvino-f32",), 1.4, 1.3, 1.5), (("", "scheduler:euler@10"), 1.02, 0.99, 1.05)])
    asked = []

    def judge(keys):
        asked.append(list(keys))
        return pd.DataFrame([{"key": k, "quality_verdict": OVER, "adherence_delta": -0.04,
                              "adherence_delta_lo": -0.07, "adherence_delta_hi": -0.025} for k in keys])

    found = ss.search(table, (0.97, 1.03), judge, {"scheduler:plms@50": OVER}, max_quality=0)
    assert asked == [["scheduler:plms@50"]]
    best = ss.best(found, lossless=True)
    assert best.key == "engine:openvino-f32" and best.admissible == ss.ADMISSIBLE
    assert (best.adherence_delta, best.adherence_delta_lo, best.adherence_delta_hi) == (-0.04, -0.07, -0.025)
    assert best.quality_verdict == OVER


def test_one_parts_gain_never_pays_for_anothers_loss():
    """int8 alone is undecided against the converged solve; stacked with a sampler whose own error moves the
    other way the whole may read within, and is still not admissible, nor even rendered. A candidate without a
    scheduler carries the seeds' PLMS-50 as its sampler part, judged like any other."""
    table = _table([((PTQ, "scheduler:euler@10"), 14.0, 13.5, 14.5), ((PTQ,), 4.0, 3.9, 4.1),
                    (("deepcache:3",), 2.0, 1.9, 2.1), (("", "scheduler:euler@25"), 1.9, 1.8, 2.0)])
    assert ss.Candidate(PTQ).lossy_parts == [PTQ, "scheduler:plms@50"]
    asked = []

    def judge(keys):
        asked.extend(keys)
        return pd.DataFrame([{"key": k, "quality_verdict": WITHIN, "adherence_delta": 0.05} for k in keys])

    parts = {PTQ: UNDECIDED, "scheduler:euler@10": WITHIN, "scheduler:plms@50": OVER, "deepcache:3": WITHIN,
             "scheduler:euler@25": WITHIN}
    found = ss.search(table, (0.97, 1.03), judge, parts, max_quality=10, batch=1).set_index("key")
    assert asked == ["scheduler:euler@25"]  # the others fell to a part; this one is a part itself (read back)
    assert found.loc[f"{PTQ}+scheduler:euler@10", "admissible"] == ss.PRUNED
    assert f"{PTQ} alone is undecided" in found.loc[f"{PTQ}+scheduler:euler@10", "why"]
    assert "scheduler:plms@50 alone is over budget" in found.loc["deepcache:3", "why"]
    assert found.loc["scheduler:euler@25", "admissible"] == ss.ADMISSIBLE
    # controls that failed admit nothing lossy, however the parts read
    untrusted = ss.search(table, (0.97, 1.03), judge, parts, max_quality=10, trusted=False,
                          distrust="control:fp32-twin read 'over budget'")
    assert ss.best(untrusted) is None
    assert untrusted.why.str.contains("cannot be trusted: control:fp32-twin").any()


def test_a_lossless_part_adds_no_rendering_and_a_parts_own_rows_cost_none():
    """int8 + f32 stage engine is judged as int8 alone: one rendering for both, and a part's own rows (read back,
    not rendered) do not count against the search's rendering budget."""
    ptq, f32, int8w = PTQ, "stages:openvino-f32", "stages:openvino-int8w"
    table = _table([((ptq, "scheduler:euler@10", f32), 9.0, 8.8, 9.2), ((ptq, "scheduler:euler@10", int8w), 8.9, 8.7, 9.1),
                    ((ptq, "scheduler:euler@10"), 8.5, 8.3, 8.7), (("", "scheduler:euler@10", f32), 1.9, 1.8, 2.0)])
    assert ss.Candidate(ptq, "scheduler:euler@10", f32).picture_key == f"{ptq}+scheduler:euler@10"
    asked = []
    verdicts = {f"{ptq}+scheduler:euler@10": UNDECIDED, f"{ptq}+{int8w}+scheduler:euler@10": UNDECIDED,
                "scheduler:euler@10": WITHIN}

    def judge(keys):
        asked.append(list(keys))
        return pd.DataFrame([{"key": k, "quality_verdict": verdicts[k], "adherence_delta": -0.02} for k in keys])

    parts = {ptq: WITHIN, int8w: WITHIN, "scheduler:euler@10": WITHIN}
    found = ss.search(table, (0.97, 1.03), judge, parts, max_quality=2, batch=1)
    flat = [k for keys in asked for k in keys]
    assert flat == [f"{ptq}+scheduler:euler@10", f"{ptq}+{int8w}+scheduler:euler@10", "scheduler:euler@10"]
    best = ss.best(found)  # reached although 2 renderings were the budget: a part's own rows are read back
    assert best.key == f"{f32}+scheduler:euler@10" and best.judged_as == "scheduler:euler@10"
    t = found.set_index("key")
    assert t.loc[f"{ptq}+scheduler:euler@10", "quality_verdict"] == UNDECIDED  # shared with its f32-stage twin


def test_the_pareto_front_keeps_only_undominated_points():
    pts = pd.DataFrame({"speedup": [1.0, 2.0, 3.0, 2.5], "adherence_delta": [0.0, -0.001, -0.05, -0.06]})
    front = ss.pareto(pts, "speedup", "adherence_delta", higher_is_better=True)
    assert list(front.speedup) == [1.0, 2.0, 3.0]
    fid = pd.DataFrame({"speedup": [1.0, 2.0, 3.0], "fid_delta": [0.0, 5.0, 1.0]})
    assert list(ss.pareto(fid, "speedup", "fid_delta", higher_is_better=False).speedup) == [1.0, 3.0]
    assert ss.pareto(fid.iloc[:0], "speedup", "fid_delta", higher_is_better=False).empty  # nothing judged: no front


def test_the_reports_answer_is_written_from_the_headline_rows():
    from sdperf.report.report import headline_sentences

    sc = "best admissible stack: int8:openvino-nncf-ptq+scheduler:euler@25"
    rows = pd.DataFrame([
        dict(notebook="10_ladder", scenario=sc, metric="seed_speedup_vs_fp32", value=9.1234, lo=8.5, hi=9.6,
             note="per image; faster", method="fresh processes, 3 rounds"),
        dict(notebook="10_ladder", scenario=sc, metric="unet_step_speedup_vs_fp32", value=6.5, lo=6.4, hi=6.9,
             note="per UNet call", method="fresh processes, 3 rounds"),
        dict(notebook="10_ladder", scenario=sc, metric="reference_adherence_delta", value=0.061, lo=0.04, hi=0.08,
             note="trained reference model; within budget", method="m"),
        dict(notebook="10_ladder", scenario=sc, metric="setup", value=95.0, lo=None, hi=None, note="", method="m"),
        dict(notebook="09_fewer_steps", scenario="x", metric="seed_speedup_vs_fp32", value=2.0, lo=1.9, hi=2.1,
             note="", method="m")])
    (s,) = headline_sentences(rows)
    assert "int8:openvino-nncf-ptq+scheduler:euler@25" in s and "9.12x [8.50-9.60]" in s
    assert "6.50x [6.40-6.90] per UNet step" in s and "+0.061 [+0.040, +0.080]" in s and "set-up 95 s" in s
    assert headline_sentences(rows[rows.notebook != "10_ladder"]) == []
    from sdperf.report.findings import Legend

    legend = Legend()  # on the page the method is a label; its text appears once, in the findings' legend
    (short,) = headline_sentences(rows, legend)
    assert short.endswith("Method [M1].") and legend.texts == ["fresh processes, 3 rounds"]


def test_the_answer_says_when_no_stack_met_the_budget():
    from sdperf.report.report import no_admissible_sentence

    rows = pd.DataFrame([
        dict(notebook="10_ladder", scenario="stack search: a+b", metric="composed_seed_speedup_vs_fp32", value=15.06,
             note="not admissible: quality undecided", method="m"),
        dict(notebook="10_ladder", scenario="stack search: c+d", metric="composed_seed_speedup_vs_fp32", value=13.7,
             note="not admissible: quality over budget", method="m")])
    s = no_admissible_sentence(rows)
    assert "judged 2 candidates" in s and "1 quality undecided" in s and "<b>a+b</b>" in s and "15.06x" in s
    best = dict(notebook="10_ladder", scenario="best admissible stack: a", metric="seed_speedup_vs_fp32", value=3.0,
                note="", method="m")
    assert no_admissible_sentence(pd.concat([rows, pd.DataFrame([best])])) is None


@pytest.mark.parametrize("name", ["cpu", "cpu-full", "smoke"])
def test_one_list_gives_every_notebook_its_keys_and_12_judges_every_lossy_one(name):
    """A profile names each technique once; 10 searches and 12 judges from the same list, so every lossy part the
    search combines and every lossy key a notebook measures stand-alone is judged; cpu-full judges every lossy
    technique the catalog declares."""
    from sdperf.optimizations import catalog
    from sdperf.config.profiles import load_profile
    from sdperf.run import prefetch
    from sdperf.select.stack_search import UNET_FAMILIES

    prof = load_profile(name, check_runtime=False)
    judged = set(catalog.among(prof.techniques, lossy=True))
    parts = catalog.among(prof.techniques, None, UNET_FAMILIES) + catalog.among(prof.techniques, None, (catalog.STAGES,))
    assert {k for k in parts if catalog.Stack.of(k).changes_output} <= judged
    owners = {catalog.Stack.of(k).techniques[0].notebook for k in prof.techniques}
    measured = {k for nb in owners - {prefetch.PRECISION_NOTEBOOK}
                for k in prefetch.keys_of(nb, prefetch.parameters(nb, prof), prof)}
    unjudged = {k for k in measured if catalog.Stack.of(k).changes_output} - judged
    assert not unjudged, f"{name}: lossy techniques measured stand-alone but never judged: {unjudged}"
    if name == "cpu-full":
        missing = [k for k in catalog.keys() if catalog.get(k).changes_output and k not in judged]
        assert not missing, f"lossy techniques 12 would never judge: {missing}"


def test_an_eager_candidate_divides_each_baseline_worker_by_itself():
    """A round holds several fp32 baseline workers: each is its own PLMS-50 reference."""
    raw = pd.DataFrame([{"config": BASELINE, "round": r, "status": "ok", "stages": _stages(unet=u),
                         "vae_decode_s": 1.0, "s_per_image_seed": 0.5 + 51 * (u + 0.001) + 1.0}
                        for r, u in ((0, 2.0), (0, 2.2), (1, 2.1))])
    ts = list(range(20))
    got = ss.composed_speed(raw, pd.DataFrame(columns=["config", "round"]), {ss.BASELINE_KEY: BASELINE},
                            ss.Candidate("", "scheduler:euler@20"), ts)
    want = [(0.5 + 51 * (u + 0.001) + 1.0) / (0.5 + 20 * (u + 0.001) + 1.0) for u in (2.0, 2.2, 2.1)]
    assert got["rounds"] == 3 and got["speedup"] == pytest.approx(sorted(want)[1])


def test_a_consistency_student_brings_its_own_sampler_into_the_search():
    from sdperf.select import stack_search as ss

    cand = ss.Candidate(unet="distill:lcm@4+precision:bfloat16", stages="decoder:tiny")
    assert cand.owner == "distill:lcm@4" and cand.sampler == "distill:lcm@4"
    # judged as its lossy parts alone: no PLMS-50 sampler is added to a student that samples itself
    assert cand.lossy_parts == ["distill:lcm@4", "precision:bfloat16", "decoder:tiny"]
    found = {c.key for c in ss.candidates(["distill:lcm@4+precision:bfloat16", "distill:guidance"],
                                          ["scheduler:euler@10"], ["decoder:tiny", "stages:openvino-int8w"])}
    assert "distill:lcm@4+precision:bfloat16+decoder:tiny" in found
    assert "distill:guidance+decoder:tiny+scheduler:euler@10" in found
    assert not any("lcm" in k and "scheduler:" in k for k in found)  # the student's sampler is not replaced
    assert not any("decoder:tiny" in k and "stages:" in k for k in found)  # both replace the decoder
    ts = ss.timesteps(load_profile_smoke(), "distill:lcm@4")
    assert len(ts) == 4 and ts[0] == 999.0  # LCM starts from the noise's own level


def load_profile_smoke():
    from sdperf.config.profiles import load_profile

    return load_profile("smoke", check_runtime=False)
