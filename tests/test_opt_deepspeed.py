"""DeepSpeed-Inference: the replaced-module counter, availability without CUDA, an honest record on the tiny
pipeline (0 modules replaced -> pass-through, never a speed-up), and DeepSpeed's own injection policies checked
against the SD module tree on the CPU (a diffusers/transformers drift fails here, not on a GPU)."""
from __future__ import annotations

import copy
import types

import pytest
import torch

from sdperf.experiments import deepspeed as exp
from sdperf.optimizations import deepspeed_inference as ds
from sdperf.optimizations import deepspeed_policies as dp
from sdperf.model.pipelines import build_pipeline
from sdperf.store.results import read_results
from sdperf.measure.study import open_study


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
    assert ds.availability("cuda", clip_adapter=True)[0]
    ok, reason = ds.availability("cuda")  # the lock's transformers stops the seed's call before any kernel
    assert not ok and "DSClipEncoder: missing CLIPTextModel.text_model" in reason


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


# --- DeepSpeed's policies against the SD module tree (deepspeed_policies), on the CPU -------------------------------

def _meta_classes(arch_name: str) -> dict[str, set]:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from sdperf.config import architectures

    arch = architectures.get(arch_name)
    with torch.device("meta"):  # shapes only: SD 1.5's tree in a fraction of a second
        built = {"unet": UNet2DConditionModel(**arch.unet), "vae": AutoencoderKL(**arch.vae),
                 "text_encoder": CLIPTextModel(CLIPTextConfig(**arch.text_encoder))}
    return {name: {type(m) for m in module.modules()} for name, module in built.items()}


def test_the_tiny_twin_has_the_module_classes_of_sd15_and_sd2():
    """What lets the policy check run on the tiny twin: DeepSpeed matches classes, and the twin has SD's."""
    tiny = _meta_classes("tiny")
    assert _meta_classes("sd15") == tiny
    sd2 = _meta_classes("sd2-base")
    assert sd2["unet"] == tiny["unet"] and sd2["vae"] == tiny["vae"]
    # SD 2's OpenCLIP tower differs only in its activation (gelu, not quick_gelu), which no policy reads
    assert {c.__module__ for c in sd2["text_encoder"] ^ tiny["text_encoder"]} == {"transformers.activations"}


def _rows(table) -> dict:
    return {r["policy"]: r for r in table.to_dict("records")}


def _paths(module, prefix: str, cls) -> set[str]:
    return {p for p, m in module.named_modules(prefix=prefix) if type(m) is cls}


def test_policies_match_the_sd_tree_with_the_clip_adapter(tiny_pipe):
    from deepspeed.module_inject.replace_policy import generic_policies
    from deepspeed.ops.transformer.inference.diffusers_attention import DeepSpeedDiffusersAttention
    from deepspeed.ops.transformer.inference.op_binding.base import BaseOp
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.attention_processor import Attention
    from transformers.models.clip.modeling_clip import CLIPEncoderLayer

    before, state = ds.census(tiny_pipe), (BaseOp.inference_module, DeepSpeedDiffusersAttention.layer_id)
    table = dp.policy_table(tiny_pipe, clip_adapter=True)
    rows = _rows(table)
    assert [c.__name__ for c in generic_policies] == ["UNetPolicy", "VAEPolicy"]  # the rows below are all of them
    assert set(rows) == {"DSClipEncoder", "UNetPolicy", "VAEPolicy", "HFCLIPLayerPolicy"}
    assert all(not r["missing"] and not r["error"] for r in rows.values()), table[["policy", "missing", "error"]]
    assert dp.mismatches(table) == [] and dp.mismatches(table, applied_only=False) == []

    assert rows["DSClipEncoder"]["replaced"] == {"text_encoder": "DSClipEncoder"}
    unet = rows["UNetPolicy"]
    assert unet["matched"] == ("unet",) and unet["expected_class"].endswith(".UNet2DConditionModel")
    attention, blocks = _paths(tiny_pipe.unet, "unet", Attention), _paths(tiny_pipe.unet, "unet", BasicTransformerBlock)
    assert len(attention) == 12 and len(blocks) == 6  # the tiny UNet's 6 transformer blocks, 2 attentions each
    assert unet["replaced"] == {"unet": "DSUNet", **dict.fromkeys(attention, "DeepSpeedDiffusersAttention"),
                                **dict.fromkeys(blocks, "DeepSpeedDiffusersTransformerBlock")}
    vae = rows["VAEPolicy"]
    assert vae["matched"] == ("vae",) and vae["replaced"] == {"vae": "DSVAE"}  # its Attention modules are kept
    assert _paths(tiny_pipe.vae, "vae", Attention)
    clip = rows["HFCLIPLayerPolicy"]
    assert set(clip["matched"]) == _paths(tiny_pipe.text_encoder, "text_encoder", CLIPEncoderLayer) != set()
    assert not clip["applied_by_generic_injection"]

    # everything ran on copies, and DeepSpeed's class state is as it was
    assert ds.census(tiny_pipe) == before and not hasattr(tiny_pipe.text_encoder, "text_model")
    assert (BaseOp.inference_module, DeepSpeedDiffusersAttention.layer_id) == state


def test_without_the_adapter_the_missing_text_model_is_reported(tiny_pipe):
    table = dp.policy_table(tiny_pipe)
    rows = _rows(table)
    assert rows["DSClipEncoder"]["missing"] == ("CLIPTextModel.text_model",)
    assert rows["DSClipEncoder"]["replaced"] == {}  # generic_injection stops there
    assert dp.mismatches(table) == ["DSClipEncoder: missing CLIPTextModel.text_model"]
    assert dp.twin_mismatches(False) == ("DSClipEncoder: missing CLIPTextModel.text_model",)
    assert dp.twin_mismatches(True) == ()


@pytest.mark.parametrize("drift", ["renamed", "removed"])
def test_a_policy_whose_class_moved_is_reported_as_not_matching(tiny_pipe, monkeypatch, drift):
    """diffusers renames or moves UNet2DConditionModel: DeepSpeed's UNetPolicy then matches no component."""
    from diffusers.models.unets import unet_2d_condition

    if drift == "renamed":
        renamed = type("UNet2DConditionModel2", (), {"__module__": unet_2d_condition.__name__})
        monkeypatch.setattr(unet_2d_condition, "UNet2DConditionModel", renamed)
    else:
        monkeypatch.delattr(unet_2d_condition, "UNet2DConditionModel")
    table = dp.policy_table(tiny_pipe, clip_adapter=True)
    unet = _rows(table)["UNetPolicy"]
    assert unet["matched"] == () and unet["replaced"] == {}
    found = dp.mismatches(table)
    if drift == "renamed":
        assert found == ["UNetPolicy: matches no component "
                         "(it expects diffusers.models.unets.unet_2d_condition.UNet2DConditionModel2)"]
    else:  # generic_injection builds every generic policy for every component: the whole call fails
        gone = "missing diffusers.models.unets.unet_2d_condition.UNet2DConditionModel"
        assert found == [f"{p}: {gone}" for p in ("DSClipEncoder", "UNetPolicy", "VAEPolicy")]


def test_modules_without_the_attributes_the_policies_read_are_reported(tiny_pipe):
    """A UNet attention without `to_q` and CLIP attentions without `q_proj`: each policy names what it missed."""
    from diffusers.models.attention_processor import Attention

    unet, te = copy.deepcopy(tiny_pipe.unet), copy.deepcopy(tiny_pipe.text_encoder)
    first = next(m for m in unet.modules() if type(m) is Attention)
    first.query = first.to_q
    del first.to_q
    for layer in te.encoder.layers:
        layer.self_attn.query = layer.self_attn.q_proj
        del layer.self_attn.q_proj
    drifted = types.SimpleNamespace(text_encoder=te, unet=unet, vae=tiny_pipe.vae)
    table = dp.policy_table(drifted, clip_adapter=True)
    rows = _rows(table)
    assert rows["UNetPolicy"]["missing"] == ("Attention.to_q",)
    assert rows["HFCLIPLayerPolicy"]["missing"] == ("CLIPAttention.q_proj",)
    assert rows["VAEPolicy"]["missing"] == () and rows["DSClipEncoder"]["missing"] == ()
    assert dp.mismatches(table) == ["UNetPolicy: missing Attention.to_q"]  # the CLIP layer policy is not applied
    assert "HFCLIPLayerPolicy: missing CLIPAttention.q_proj" in dp.mismatches(table, applied_only=False)
    with pytest.raises(ValueError, match="holds no nn.Module attribute"):
        dp.policy_table(object())


def test_doctor_names_the_policy_mismatch_on_a_gpu_profile():
    """sdperf doctor reads the catalog's availability: on a CUDA profile, also without CUDA here, the seed's
    call is refused with the missing attribute, and the adapted rung only for the missing CUDA device."""
    from sdperf.optimizations import catalog
    from sdperf.config.profiles import load_profile

    ctx = catalog.Context(load_profile("sd15-a10g", check_runtime=False))
    ok, reason = catalog.get("deepspeed:inject").availability(ctx)
    assert not ok and "missing CLIPTextModel.text_model" in reason and "deepspeed:inject-clip-adapter" in reason
    ok, reason = catalog.get("deepspeed:inject-clip-adapter").availability(ctx)
    assert ok == torch.cuda.is_available() and "text_model" not in reason
