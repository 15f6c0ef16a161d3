"""The catalog: every technique declared once, found by key, with a reason wherever it cannot run."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sdperf.core.errors import ConfigError
from sdperf.optimizations import catalog
from sdperf.optimizations.catalog import Context, Stack

LIB = Path(__file__).resolve().parents[1] / "lib" / "sdperf"


def test_every_key_is_found_by_itself_and_declared_by_its_own_module():
    keys = catalog.keys()
    assert len(keys) == len(set(keys)) > 30
    for key in keys:
        tech = catalog.get(key)
        assert tech.key == key and tech.family in catalog.FAMILIES and tech.notebook[:2].isdigit()
    for key in ("grad:inference_mode", "deepspeed:inject", "cuda_graphs", "engine:openvino-f32",
                "int8:openvino-nncf-ptq", "compile:freezing", "precision:bfloat16", "allocator:jemalloc"):
        assert key in keys


def test_parametric_keys_and_bad_keys():
    assert catalog.get("scheduler:euler@10").steps == 10
    assert catalog.get("compile:max-autotune-no-cudagraphs+freezing").family == catalog.EXECUTOR
    with pytest.raises(ConfigError, match="valid techniques: .*grad:inference_mode"):
        catalog.get("inference-mode")
    with pytest.raises(ConfigError, match="dpmpp-2m@20"):
        catalog.get("scheduler:plms")
    with pytest.raises(ConfigError, match="not a valid mode"):
        catalog.get("compile:fastest")


def test_a_stack_takes_one_technique_per_family_and_knows_what_it_runs():
    s = Stack.of("precision:float16+grad:no_grad+scheduler:dpmpp-2m@20")
    assert (s.dtype, s.grad_mode, s.steps, s.changes_output) == ("float16", "no_grad", 20, True)
    assert [t.key for t in Stack.of("compile:channels_last+freezing+cuda_graphs").techniques] == \
        ["compile:channels_last+freezing", "cuda_graphs"]
    assert Stack.of("").key == catalog.BASELINE_KEY and Stack.of(catalog.BASELINE_KEY).techniques == ()
    with pytest.raises(ConfigError, match="unet executor"):
        Stack.of("engine:openvino-f32+int8:openvino-nncf-ptq")


@pytest.mark.parametrize("stack", ["deepcache:2+engine:openvino-f32", "tome:0.5+int8:openvino-nncf-weights",
                                   "precision:bfloat16+deepcache:2+int8:openvino-nncf-weights",
                                   "deepcache:3+engine:onnxruntime-fp32", "tome:0.3+engine:tensorrt-fp16"])
def test_feature_caching_and_token_merging_never_stack_under_an_engine_that_traces_the_unet(stack):
    """DeepCache and ToMe wrap the UNet's blocks in Python; an exported engine runs a trace, in which that Python
    is one frozen branch (the cpu run at 524c39a failed rung 4 of its ladder on the first stack here)."""
    with pytest.raises(ConfigError, match="patches the PyTorch UNet's blocks in Python"):
        Stack.of(stack)


@pytest.mark.parametrize("stack", ["deepcache:2+compile:freezing", "deepcache:2+int8:torch-ao-dynamic",
                                   "tome:0.5+int8:torchao-int8-dynamic", "deepcache:2+stages:openvino-int8w",
                                   "precision:bfloat16+int8:openvino-nncf-weights"])
def test_what_caching_and_merging_may_stack_with(stack):
    """Dynamo traces the Python it compiles with guards, a module swap keeps the blocks, stage engines leave the UNet."""
    assert Stack.of(stack).key == stack


def test_availability_of_every_technique_is_a_reason(smoke):
    ctx = Context(smoke)
    for key in catalog.keys():
        ok, reason = catalog.get(key).availability(ctx)
        assert isinstance(ok, bool) and isinstance(reason, str) and reason
    assert not catalog.get("cuda_graphs").availability(ctx)[0]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_nothing_in_lib_imports_the_experiments():
    offenders = [str(p.relative_to(LIB)) for p in LIB.rglob("*.py")
                 if "experiments" not in p.parts and any(m.startswith("sdperf.experiments") for m in _imports(p))]
    assert offenders == []


def test_training_launch_and_train_do_not_import_each_other():
    launch = LIB / "training" / "launch.py"
    # train may use launch (resolve_backend), so launch must not come back to train
    assert "sdperf.training.train" not in _imports(launch)


@pytest.mark.parametrize("key", ["calibration:unet-twice", "compile:default", "int8:torch-ao-dynamic",
                                 "scheduler:dpmpp-2m@20", "attention:classic", "attention:sliced:auto",
                                 "grad:no_grad", "deepspeed:unet-fp32"])
def test_a_loop_only_technique_leaves_the_text_encoder_and_vae_as_they_were(smoke, key):
    """Its worker skips the VAE decode and borrows the baseline's (sdperf.measure.rounds.with_baseline_decode): that is only
    sound when apply() touches nothing but the denoising loop (pipe.unet, pipe.scheduler)."""
    import torch

    from sdperf.model.pipelines import build_pipeline

    pipe = build_pipeline(smoke)
    vae, text = pipe.vae, pipe.text_encoder
    before = {n: {k: v.clone() for k, v in m.state_dict().items()} for n, m in (("vae", vae), ("text", text))}
    processors = {n: type(p) for n, p in vae.attn_processors.items()}
    stack = Stack.of(key)
    assert stack.loop_only
    pipe = stack.apply(pipe, Context(smoke))
    assert pipe.vae is vae and pipe.text_encoder is text
    for name, m in (("vae", pipe.vae), ("text", pipe.text_encoder)):
        after = m.state_dict()
        assert before[name].keys() == after.keys()
        assert all(torch.equal(before[name][k], after[k]) for k in after), name
    assert {n: type(p) for n, p in pipe.vae.attn_processors.items()} == processors
    assert not any(p.requires_grad for m in (pipe.vae, pipe.text_encoder) for p in m.parameters())


def test_only_techniques_that_touch_the_loop_alone_skip_the_decode():
    assert not Stack.of(catalog.BASELINE_KEY).loop_only  # the baseline is always timed whole
    for key in ("precision:bfloat16", "parameters:trainable", "grad:grad+parameters:trainable",
                "allocator:jemalloc", "deepspeed:inject"):  # each changes more than the loop (the VAE's weights,
        assert not Stack.of(key).loop_only, key  # what its decode records, the whole process, the pipeline)
    for key in ("engine:openvino-f32", "int8:openvino-nncf-ptq", "compile:freezing", "cuda_graphs",
                "scheduler:euler@25", "attention:classic", "grad:no_grad", "deepspeed:unet-fp32"):
        assert Stack.of(key).loop_only, key
    assert Stack.of("engine:openvino-f32+scheduler:dpmpp-2m@20").loop_only  # both change only the loop
    assert not Stack.of("engine:openvino-f32+precision:bfloat16").loop_only  # a whole stack or nothing
