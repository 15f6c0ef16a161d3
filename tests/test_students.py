"""The reference model's students: the committed ones intact and as good as their manifests say, judged afresh; the
command that makes them checked at quick scale (resumable, refusing another recipe's folder, bad input named)."""
from __future__ import annotations

import json
import shutil

import pytest

from sdperf.core.errors import ConfigError
from sdperf.refmodel import domain, domain_quality, evaluator, storage, student_command, student_recipe
from sdperf.refmodel.student_recipe import KINDS

N = 48  # captions judged afresh: a floor several standard errors below each manifest's adherence at this n


@pytest.fixture(scope="module")
def teacher():
    return storage.load()


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_student_matches_its_manifest_and_names_its_teacher(kind):
    module, manifest = student_command.load(kind)
    teacher = storage.read_manifest(storage.default_dir())
    assert manifest["command"].startswith(f"sdperf train-student {kind}") and manifest["commit"] != "unknown"
    assert manifest["recipe"] == student_recipe.recipe(kind).to_dict()
    assert manifest["teacher"]["weights"] == student_command._teacher_digest(teacher)
    assert manifest["times_s"]["training"] > 0 and manifest["judge"]["student"]["n"] >= 500
    if kind != "tiny-decoder":
        assert module.config.time_cond_proj_dim == student_recipe.recipe(kind).guidance_dim


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_student_follows_unseen_captions(kind, teacher):
    pipe, net, _ = teacher
    module, manifest = student_command.load(kind)
    recipe = student_recipe.recipe(kind)
    student_command.place(pipe, kind, module, student_command.SAMPLER[kind])
    items = domain.scenes(domain_quality.PROMPT_SEED, N, start=20_000)  # beyond the manifest's 500
    images = domain_quality.generate(pipe, [s.caption for s in items], list(range(N)), recipe.check_guidance,
                                     recipe.check_steps, batch=N)
    scores = evaluator.adherence_checks(evaluator.predict(net, images), domain.labels_many(items))
    assert scores.mean() >= min(0.8, manifest["judge"]["student"]["adherence_ci"][0] - 0.1), scores.mean()
    others = evaluator.adherence_checks(evaluator.predict(net, images), domain.labels_many(items[1:] + items[:1]))
    assert others.mean() < scores.mean() - 0.2, (others.mean(), scores.mean())


def test_a_changed_student_file_is_named_by_load(tmp_path):
    copy = tmp_path / "lcm-student"
    shutil.copytree(student_command.default_dir("lcm"), copy)
    weights = copy / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ConfigError, match="diffusion_pytorch_model.safetensors"):
        student_command.load("lcm", copy)


@pytest.mark.parametrize("kind", KINDS)
def test_the_quick_command_trains_stores_and_resumes(kind, tmp_path):
    out = tmp_path / kind
    student_command.main(kind, out=str(out), quick=True, show=False)
    manifest = storage.verify(out)
    assert manifest["kind"] == kind and manifest["recipe"] == student_recipe.quick(kind).to_dict()
    module, _ = student_command.load(kind, out)
    work = student_command.work_dir(student_recipe.quick(kind), out, manifest["teacher"]["weights"])
    curve = json.loads((out / "training.json").read_text())[kind]
    assert [p["step"] for p in curve] == [student_recipe.quick(kind).steps]
    # a second run resumes from the finished checkpoint: the same weights, no step taken again
    times = json.loads((work / student_command.TIMES).read_text())
    student_command.main(kind, out=str(out), quick=True, show=False)
    again, _ = student_command.load(kind, out)
    assert all((a == b).all() for a, b in zip(module.state_dict().values(), again.state_dict().values()))
    assert json.loads((work / student_command.TIMES).read_text())["data"] == times["data"]


def test_the_command_refuses_another_recipes_folder_and_bad_input_before_training(tmp_path):
    out = tmp_path / "guidance"
    student_command.main("guidance", out=str(out), quick=True, show=False)
    with pytest.raises(ConfigError, match="another recipe.*--force"):
        student_command.main("guidance", out=str(out), quick=True, seed=1, show=False)
    with pytest.raises(ConfigError, match="'bogus'.*lcm, guidance, tiny-decoder"):
        student_recipe.recipe("bogus")
    with pytest.raises(ConfigError, match="w_min=12.*w_max=11"):
        student_recipe.StudentRecipe(kind="lcm", w_min=12.0)
    with pytest.raises(ConfigError, match="check_guidance=20"):
        student_recipe.StudentRecipe(kind="lcm", check_guidance=20.0)
    (tmp_path / "notes").mkdir()
    with pytest.raises(ConfigError, match="not a student folder"):
        student_command.main("lcm", out=str(tmp_path / "notes"), quick=True, show=False)
