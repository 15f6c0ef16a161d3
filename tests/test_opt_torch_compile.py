"""torch.compile set-ups on real pieces of the tiny pipeline: output parity, scoped inductor config, what torch does
with a CUDA-graph mode on a CPU, recompile counting, availability without CUDA, clear errors."""
from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from sdperf.measure.drift import relative_error
from sdperf.model.generation import Workload
from sdperf.measure.measurements import capture_block_inputs
from sdperf.optimizations import torch_compile as tc
from sdperf.model.pipelines import build_pipeline

# Inductor reorders reductions and fuses pointwise ops; in fp32 that moves the output by ~1e-6 relative.
# 1e-4 leaves room for that and still catches wrong weights (a frozen graph reused for another block: ~1).
TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def fresh_dynamo(tmp_path, monkeypatch):
    """Every test compiles from scratch into its own inductor cache, and leaves nothing compiled behind."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def resnet(tiny_pipe, smoke):
    """The tiny UNet's first ResNet block (convolutions, GroupNorm, the time embedding's Linear) and its real inputs:
    weights freezing folds, in a graph inductor lowers in 14 s alone where the middle block took 21 s (its
    transformer adds kernels, not a different freezing path)."""
    name = "down_blocks.0.resnets.0"
    args, kwargs = capture_block_inputs(tiny_pipe, Workload.from_profile(smoke, 1), block=name)
    return copy.deepcopy(tiny_pipe.unet.get_submodule(name)), args, kwargs


class Small(torch.nn.Module):
    """Conv, GroupNorm, SiLU, Linear: the UNet's op mix in a module that compiles in seconds."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.nn.functional.silu(self.norm(self.conv(x)))
        return (self.proj(h.mean((2, 3))),)


def test_freezing_is_scoped_to_the_compiled_module_and_keeps_the_output(resnet):
    block, args, kwargs = resnet
    with torch.inference_mode():
        ref = block(*args, **kwargs)
        wrapped = tc.CompiledUNet(block, torch.compile(block), tc.parse("freezing"))
        out = wrapped(*args, **kwargs)
    assert relative_error(out, ref) < TOLERANCE
    facts = tc.compile_facts(wrapped.log)
    assert facts["graphs_compiled"] == 1 and facts["failures"] == []
    # inductor compiled with freezing on (the lazy first call ran inside the scope) ...
    assert json.loads(wrapped.log.records[0].inductor_config)["freezing"] is True
    # ... and the global config is untouched afterwards, so the next variant does not inherit it
    assert torch._inductor.config.freezing is False


def test_cuda_graph_mode_on_cpu_runs_and_the_skip_is_counted():
    m = Small().eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.inference_mode():
        ref = m(x)[0]
        wrapped = tc.CompiledUNet(m, torch.compile(m, mode="reduce-overhead"), tc.parse("reduce-overhead"))
        out = wrapped(x)[0]
    assert relative_error(out, ref) < TOLERANCE
    # torch accepts the mode on a CPU, compiles the kernels and skips the graph capture without a warning
    assert wrapped.log.cudagraph_skips == 1


def test_recompile_counter_counts_a_planted_new_shape():
    m = Small().eval()
    compiled = torch.compile(m, backend="eager", dynamic=False)
    counts = []
    for shape in [(2, 4, 8, 8), (2, 4, 8, 8), (4, 4, 8, 8), (2, 4, 8, 8)]:
        log = tc.CompileLog()
        with tc.compile_log(log), torch.inference_mode():
            compiled(torch.randn(shape))
        counts.append((tc.compile_facts(log)["graphs_compiled"], tc.compile_facts(log)["recompile_reasons"]))
    assert [c for c, _ in counts] == [1, 0, 1, 0]  # the new batch size compiles once; known shapes are cached
    assert "size mismatch at index 0" in counts[2][1][0]


def test_availability_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tc.availability("cpu", "default")[0]
    assert set(tc.CUDA_GRAPH_MODES) == {"reduce-overhead", "max-autotune"}
    for mode in tc.CUDA_GRAPH_MODES:  # not applicable, and the reason names what runs on the CPU instead
        ok, reason = tc.availability("cpu", mode)
        assert not ok and "CUDA graphs need a CUDA device" in reason
        assert f"{tc.CPU_COUNTERPART[mode]!r} is its cpu counterpart" in reason
    assert tc.CPU_COUNTERPART == {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
    ok, reason = tc.availability("cpu", "freezing")
    assert ok and "inference only" in reason
    assert tc.availability("cpu", "channels_last") == (True, "eager PyTorch with channels_last tensors")
    ok, reason = tc.availability("cuda", "openvino")
    assert not ok and "not on CUDA" in reason
    monkeypatch.setattr(tc, "has_triton", lambda: True)  # the GPU branch, answered without a GPU
    ok, reason = tc.availability("cuda", "reduce-overhead")
    assert ok and "CUDA graphs replay" in reason
    monkeypatch.setattr(tc, "has_triton", lambda: False)
    ok, reason = tc.availability("cuda", "default")
    assert not ok and "Triton" in reason
    assert tc.availability("cpu", "openvino")[0] == tc.openvino_installed()
    monkeypatch.setattr(tc, "openvino_installed", lambda: False)
    ok, reason = tc.availability("cpu", "openvino")
    assert not ok and "not installed" in reason
    monkeypatch.setattr(tc, "cpp_compiler", lambda: None)
    ok, reason = tc.availability("cpu", "default")
    assert not ok and "C++ compiler" in reason


def test_bad_spec_gives_a_clear_error_listing_valid_modes(tiny_pipe):
    with pytest.raises(ValueError) as err:
        tc.parse("fast")
    assert "'fast'" in str(err.value) and all(m in str(err.value) for m in tc.MODES + tc.FLAGS)
    with pytest.raises(ValueError, match="names 2 modes/backends"):
        tc.parse("default+openvino")
    with pytest.raises(ValueError, match="need the inductor backend"):
        tc.parse("openvino+freezing")
    with pytest.raises(ValueError, match="not a valid mode"):
        tc.apply(tiny_pipe, "max-autotune+turbo")
    assert not isinstance(tiny_pipe.unet, tc.CompiledUNet)  # nothing was changed before the error


def test_apply_wraps_the_unet_lazily_with_the_engine_contract(smoke):
    pipe = build_pipeline(smoke)
    original = pipe.unet
    pipe = tc.apply(pipe, "default+fullgraph")
    assert isinstance(pipe.unet, tc.CompiledUNet) and pipe.unet.log.records == []  # nothing compiled yet
    assert pipe.unet.dtype == torch.float32 and pipe.unet.device == torch.device("cpu")
    assert pipe.unet.config is original.config
    pipe = tc.apply(build_pipeline(smoke), "channels_last")  # eager: the weights change layout, nothing compiles
    weight = pipe.unet.conv_in.weight
    assert not isinstance(pipe.unet, tc.CompiledUNet) and weight.is_contiguous(memory_format=torch.channels_last)


def test_compile_technique_puts_the_inductor_cache_in_scratch_and_its_log_in_facts(smoke, tmp_path, monkeypatch):
    from sdperf.optimizations.catalog import Context, get

    monkeypatch.setenv(tc.CACHE_ENV, str(tmp_path / "elsewhere"))  # e.g. the fork server's default
    ctx = Context(smoke, scratch=tmp_path / "scratch")
    pipe = get("compile:default").apply(build_pipeline(smoke), ctx)
    assert os.environ[tc.CACHE_ENV] == str(tc.inductor_dir(tmp_path / "scratch")) == ctx.facts["inductor_cache"]
    assert os.environ[tc.CACHE_ENV].startswith(str(tmp_path / "scratch" / tc.CACHE_FOLDER))  # this run's own
    assert ctx.facts["compile_log"] is pipe.unet.log  # read by the worker after the timed calls


def test_run_accepts_only_compile_keys(scratch_reports):
    from sdperf.experiments import torch_compile as experiment
    from sdperf.measure.study import open_study

    study = open_study("smoke", notebook="04_torch_compile")
    with pytest.raises(ValueError, match="compile:<spec>"):
        experiment.run(study, ["compile:default", "precision:float16"])
    table = experiment.availability_table(study, ["compile:default", "compile:reduce-overhead"])
    assert list(table["available"]) == [True, False]  # smoke is a CPU profile: no CUDA graphs
