"""DeepSpeed-Inference: the replaced-module counter, availability without CUDA, and an honest record on the tiny
pipeline (0 modules replaced -> pass-through, never a speed-up)."""
from __future__ import annotations


import pytest
import torch

from sdperf.experiments import deepspeed as exp
from sdperf.optimizations import deepspeed_inference as ds
from sdperf.pipelines import build_pipeline
from sdperf.results import read_results
from sdperf.study import open_study


def _plant(pipe, n: int):
    """Put DeepSpeed's own wrappers (constructible without CUDA when graphs are off) into n components."""
    from deepspeed.model_implementations.diffusers.unet import DSUNet
    from deepspeed.model_implementations.diffusers.vae import DSVAE
    from deepspeed.model_implementations.transformers.clip_encoder import DSClipEncoder

    plants = [("unet", DSUNet), ("vae", DSVAE),
              ("text_encoder", lambda m, **kw: DSClipEncoder(ds.adapt_clip_layout(m), **kw))]
    for name, cls in plants[:n]:
        setattr(pipe, name, cls(getattr(pipe, name), enable_cuda_graph=False))


def test_counter_gives_zero_for_an_untouched_module(tiny_pipe):
    before = ds.census(tiny_pipe)
    assert ds.count_replaced(before, ds.census(tiny_pipe))["replaced_modules"] == 0
    lin = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert ds.census(lin) == {"torch.nn.modules.container.Sequential": 1, "torch.nn.modules.linear.Linear": 1,
                              "torch.nn.modules.activation.ReLU": 1}
    with pytest.raises(ValueError, match="nn.Module or a diffusers pipeline"):
        ds.census(object())


@pytest.mark.parametrize("n", [1, 2, 3])
def test_counter_counts_planted_replacements(smoke, n):
    pipe = build_pipeline(smoke)
    before = ds.census(pipe)
    _plant(pipe, n)
    got = ds.count_replaced(before, ds.census(pipe))
    assert got["replaced_modules"] == got["wrapper_modules"] == n and got["kernel_modules"] == 0
    assert all(cls.startswith("deepspeed.model_implementations.") for cls in got["new_classes"])


def test_availability_without_cuda_says_why(monkeypatch):
    ok, reason = ds.availability("cpu")
    assert not ok and "CPU accelerator" in reason and "InferenceBuilder" in reason
    ok, reason = ds.availability("cuda", arch="sdxl")
    assert not ok and "added_cond_kwargs" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not ds.availability("cuda")[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ds.availability("cuda") == (True, ds.availability("cuda")[1])


def test_bad_dtype_names_the_choices(tiny_pipe):
    with pytest.raises(ValueError, match="'int8' is not valid; choose one of: float16, float32, bfloat16"):
        ds.apply(tiny_pipe, "int8")


def test_probe_records_where_the_seed_call_stops_on_cpu(scratch_reports):
    study = open_study("smoke", notebook="06_test")
    table = exp.probe(study, say=lambda _: None).set_index("call")
    assert (table.outcome == "failed").all()
    err = table.error
    # the accelerator's dtype check comes first where oneDNN lacks fp16; elsewhere the CLIP layout stops it
    assert err.iloc[0].startswith("ValueError: Data type torch.float16") or "text_model" in err.iloc[0]
    assert err.iloc[1] == "ValueError: Generic injection only supported with FP16"
    assert "'CLIPTextModel' object has no attribute 'text_model'" in err.iloc[2]
    assert "not been implemented on CPU backend" in err.iloc[3]
    # past the CLIP step it had wrapped the text encoder and the VAE, and built no kernel
    assert table.replaced_modules.tolist() == [0, 0, 0, 2] and table.kernel_modules.sum() == 0


def test_pass_through_is_recorded_as_zero_replacements_not_a_speedup(scratch_reports):
    study = open_study("smoke", notebook="06_test")
    cmp = exp.compare(study, say=lambda _: None, rounds_=1, overrides={"repeats": 1})
    t = cmp.table.set_index("variant")
    assert t.loc[exp.KERNELS, "status"] == t.loc[exp.KERNELS_ADAPTED, "status"] == "not_applicable"
    row = t.loc[exp.PASS_THROUGH]
    assert row.status == "ok", row.note
    assert row.replaced_modules == 0 and "pass-through" in row.note
    assert cmp.facts[exp.PASS_THROUGH]["replaced_modules"] == 0  # counted inside the worker
    assert row.latent_rel_error == 0.0  # the same computation, bit for bit
    stored = read_results("smoke").set_index(["scenario", "metric"])
    rec = stored.loc[(f"{exp.PASS_THROUGH}, batch 1", "replaced_modules")]
    assert rec.value == 0 and "not a DeepSpeed speed-up" in rec.note
    pub = exp.published_vs_measured(study, cmp).iloc[0]
    assert pub.measured_here is None and pub.published == pytest.approx(4.53 / 2.68)
