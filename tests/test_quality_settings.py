"""The profile's quality section: validated before any model is built, every bad value named with the valid
choices, every missing file named with what was expected; labels that never let a machinery number pass as real."""
from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from sdperf.core.environment import record
from sdperf.core.errors import ConfigError
from sdperf.config.profiles import available_profiles, load_profile
from sdperf.quality import gate
from sdperf.quality.quality_settings import CLIP_ARCHS, FID_FEATURES, KEYS, settings
from sdperf.store.results import Recorder


def _with(profile, **changes):
    return dataclasses.replace(profile, quality={**profile.quality, **changes})


def test_every_profile_has_a_valid_quality_section():
    for name in available_profiles():
        s = settings(load_profile(name, check_runtime=False))
        assert s.n_images >= 2 and s.guidance_scales and s.clip_arch in CLIP_ARCHS


def test_validation_is_fast_and_needs_no_model(smoke):
    start = time.perf_counter()
    settings(smoke)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("key,value,valid", [
    ("clip_arch", "ViT-H-14", CLIP_ARCHS), ("fid_features", 1000, FID_FEATURES),
])
def test_bad_choice_names_the_value_and_the_choices(smoke, key, value, valid):
    with pytest.raises(ConfigError) as err:
        settings(_with(smoke, **{key: value}))
    msg = str(err.value)
    assert f"quality.{key}" in msg and repr(value) in msg and all(str(v) in msg for v in valid)


@pytest.mark.parametrize("key,value", [("n_images", 1), ("guidance_scales", []), ("guidance_scales", [0.5]),
                                       ("steps", 0), ("score_resolution", 8), ("guidance_scales", [2.0, 2.0]),
                                       ("reference_convergence_steps", [10, 5]),
                                       ("reference_convergence_steps", []),
                                       ("reference_convergence_steps", [5, 2.5]),
                                       ("reference_check_images", 1), ("reference_independent_steps", 1),
                                       ("reference_independent_steps", "400"), ("reference_calibration_samples", 0),
                                       ("reference_calibration_samples", 2.5), ("reference_fallbacks", -1),
                                       ("reference_fallbacks", "all")])
def test_bad_numbers_say_what_was_expected(smoke, key, value):
    with pytest.raises(ConfigError) as err:
        settings(_with(smoke, **{key: value}))
    assert f"quality.{key}" in str(err.value) and "expected" in str(err.value)


def test_the_convergence_check_follows_the_profile(smoke):
    """smoke's short ladder and few check images reach the judging plan; the cpu profile keeps the full ladder."""
    from sdperf.config.profiles import load_profile
    from sdperf.judge import converged, techniques

    plan = techniques.Plan.of(settings(smoke))
    assert plan.ladder == tuple(smoke.quality["reference_convergence_steps"]) and plan.ladder[0] < 25
    assert plan.check_images == smoke.quality["reference_check_images"]
    assert techniques.Plan.of(settings(load_profile("cpu"))).ladder == converged.LADDER
    assert plan.calibration_samples == smoke.quality["reference_calibration_samples"]
    assert plan.fallbacks == smoke.quality["reference_fallbacks"] == 1  # smoke and the hour's cpu judge one
    assert techniques.Plan.of(settings(load_profile("cpu"))).fallbacks == 1  # alternative, cpu-full all of them
    assert techniques.Plan.of(settings(load_profile("cpu-full"))).fallbacks is None


def test_unknown_and_missing_keys_list_the_valid_ones(smoke):
    with pytest.raises(ConfigError) as err:
        settings(_with(smoke, fid_resize="bicubic"))
    assert "'fid_resize'" in str(err.value) and all(k in str(err.value) for k in KEYS)
    partial = dataclasses.replace(smoke, quality={k: v for k, v in smoke.quality.items() if k != "clip_arch"})
    with pytest.raises(ConfigError, match="lacks clip_arch"):
        settings(partial)


@pytest.mark.parametrize("key,expected", [
    ("inception_weights", "Inception-v3 state dict"), ("clip_weights", "open_clip checkpoint"),
    ("captions", "COCO captions file"), ("reference", "folder of real images or a .npz"),
])
def test_missing_files_name_the_path_and_what_was_expected(smoke, tmp_path, key, expected):
    path = tmp_path / ("missing.npz" if key == "reference" else "missing.json")
    with pytest.raises(ConfigError) as err:
        settings(_with(smoke, **{key: str(path)}))
    msg = str(err.value)
    assert str(path) in msg and "does not exist" in msg and expected in msg


def test_a_malformed_captions_file_fails_at_validation(smoke, tmp_path):
    path = tmp_path / "captions_val2014.json"
    path.write_text('{"images": []}')
    with pytest.raises(ConfigError, match="has no 'annotations' list"):
        settings(_with(smoke, captions=str(path)))


def test_reference_folder_without_images_is_refused(smoke, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="folder without images"):
        settings(_with(smoke, reference=str(tmp_path)))


def _real_files(tmp_path) -> dict:
    for name in ("inception.pth", "clip.bin", "val2014.npz"):
        (tmp_path / name).write_bytes(b"x")
    return {"inception_weights": str(tmp_path / "inception.pth"), "clip_weights": str(tmp_path / "clip.bin"),
            "reference": str(tmp_path / "val2014.npz")}


def test_random_networks_are_labelled_machinery_everywhere(smoke, tmp_path):
    s = settings(smoke)
    assert s.headline().startswith("These numbers measure the machinery, not image quality")
    assert all(s.label(m).endswith("[machinery only]") for m in ("fid", "clip", "fid_vs_baseline"))
    real_nets = settings(_with(smoke, **_real_files(tmp_path)))  # real scorers, but the SD model is random
    assert "random-init diffusion model" in real_nets.headline() and real_nets.label("fid").endswith("[machinery only]")
    real = settings(dataclasses.replace(_with(smoke, **_real_files(tmp_path)), weights="/models/sdxl"))
    assert real.label("fid") == "FID" and real.label("clip") == "CLIP score"
    assert real.headline().startswith("Quality figures from real weights")


def _gate_study(tmp_path, scratch_reports, **quality):
    xl = load_profile("sdxl-1024", check_runtime=False)
    mlperf = dict(_real_files(tmp_path), n_images=5000, guidance_scales=[8.0], clip_arch="ViT-B-32-quickgelu")
    prof = dataclasses.replace(_with(xl, **{**mlperf, **quality}), weights="/models/sdxl")
    study = SimpleNamespace(profile=prof, recorder=Recorder("12_fid_clip", prof.name, record(prof.name, "cpu")))
    return study, settings(prof)


@pytest.mark.parametrize("fid,clip,verdict", [(23.5, 31.75, "pass"), (24.5, 31.75, "fail"), (23.5, 31.5, "fail")])
def test_mlperf_gate_verdict_with_real_weights(tmp_path, scratch_reports, fid, clip, verdict):
    study, s = _gate_study(tmp_path, scratch_reports)
    table = pd.DataFrame([{"guidance": 8.0, s.label("fid"): fid, s.label("clip"): clip}])
    out = gate.verdict(study, s, table)
    assert out["verdict"].startswith(verdict) and out["fid_bounds"] == (23.01085758, 23.95007626)
    assert study.recorder.table().value.tolist() == [1.0 if verdict == "pass" else 0.0]


def test_mlperf_gate_is_not_applicable_off_its_conditions(smoke, tmp_path, scratch_reports):
    study, s = _gate_study(tmp_path, scratch_reports, n_images=500)
    out = gate.verdict(study, s, pd.DataFrame())
    assert out["verdict"] == "not applicable: n_images=500, the gate's bounds hold for exactly 5,000 captions"
    random = SimpleNamespace(profile=smoke, recorder=study.recorder)
    reasons = gate.why_not_applicable(random, settings(smoke))
    assert any("SDXL" in r for r in reasons) and "random-init Inception" in reasons


def test_the_mlperf_gate_without_a_curve_says_the_run_did_not_measure_one(tmp_path, scratch_reports):
    study, s = _gate_study(tmp_path, scratch_reports)
    assert gate.why_not_applicable(study, s) == []  # every gate condition holds: only the missing curve stops it
    out = gate.verdict(study, s, None)
    assert out["verdict"] == "not applicable: this run did not measure the curve" and out["fid"] is None


def test_a_run_without_the_sd_curve_records_why_and_scores_nothing(smoke, scratch_reports, capsys):
    from sdperf.experiments.fid_clip import FidClip

    study = SimpleNamespace(profile=smoke, recorder=Recorder("12_fid_clip", smoke.name, record(smoke.name, "cpu")))
    q = FidClip(study, settings(smoke))
    q.generate([], sd_curve=False)
    assert q.load_scorers() is None  # no curve and no rungs: Inception and CLIP are never built
    assert q.score_curve().empty and q.plot_curve([]) is None and q.sample_grid() is None
    # the notebook's own cells, in order, up to the reference model's section (a run without the curve once failed
    # in a section this test did not call)
    import nbformat

    from sdperf.core.paths import REPO_ROOT

    nb = nbformat.read(REPO_ROOT / "notebooks" / "12_fid_clip.ipynb", as_version=4)
    ran, scope = [], {"q": FidClip(study, settings(smoke)), "rungs": [], "sd_curve": False, "compare_profiles": []}
    for cell in nb.cells:
        if cell.cell_type != "code" or "q." not in cell.source or "open_fid_clip" in cell.source:
            continue
        if "reference_curve" in cell.source:
            break
        exec(cell.source, scope)
        ran.append(cell.source.splitlines()[-1])
    assert any("score_rungs" in r for r in ran) and any("plot_curve" in r for r in ran)
    rows = study.recorder.table()
    assert sorted(rows.metric) == ["clip_score [machinery only]", "fid [machinery only]"]
    assert (rows.status == "skipped").all() and rows.value.isna().all()
    assert all("sd_curve parameter is off" in n and "reference model" in n for n in rows.note)
    assert "did not measure the curve" in q.gate_verdict()
    assert "no curve images" in capsys.readouterr().out
