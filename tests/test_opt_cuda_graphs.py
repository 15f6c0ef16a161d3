"""CUDA graphs: availability without CUDA, the wrapper's refusals and plumbing, and the CPU counterpart
(the host-side share of a UNet step) on the tiny pipeline."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._pytree import tree_flatten

from sdperf.experiments import cuda_graphs as exp
from sdperf.model.generation import Workload
from sdperf.optimizations import cuda_graphs
from sdperf.store.results import read_results
from sdperf.measure.study import open_study


def test_availability_says_why_without_cuda(monkeypatch):
    ok, reason = cuda_graphs.availability("cpu")
    assert not ok and "'cpu'" in reason and "CUDAGraph" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, reason = cuda_graphs.availability("cuda")
    assert not ok and "is_available() is False" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok, reason = cuda_graphs.availability("cuda")
    assert ok and "static tensors" in reason


@pytest.fixture(scope="module")
def inputs(tiny_pipe, smoke):
    return exp.step_inputs(tiny_pipe, Workload.from_profile(smoke, batch_size=1))


def test_graphed_unet_keeps_the_unet_interface_and_refuses_cpu_tensors(tiny_pipe, inputs):
    wrapped = cuda_graphs.GraphedUNet(tiny_pipe.unet)
    assert wrapped.dtype == torch.float32 and wrapped.device == torch.device("cpu")
    assert wrapped.config is tiny_pipe.unet.config and wrapped.captures == 0
    (x, t), kwargs = inputs
    with pytest.raises(ValueError, match="must be a CUDA tensor; got cpu"):
        wrapped(x, t, **kwargs)
    assert wrapped.captures == 0
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        cuda_graphs.GraphedUNet(tiny_pipe.unet, warmup=0)


def test_apply_refuses_a_cpu_pipeline_and_leaves_it_untouched(tiny_pipe):
    unet = tiny_pipe.unet
    with pytest.raises(ValueError, match="need it on a CUDA device"):
        cuda_graphs.apply(tiny_pipe)
    assert tiny_pipe.unet is unet


def test_the_captured_call_computes_the_eager_unet_output(tiny_pipe, inputs):
    """What a capture records is `_call` on the flattened inputs: it must be the eager UNet call, exactly."""
    (x, t), kwargs = inputs
    extra = {k: v for k, v in kwargs.items() if k not in ("encoder_hidden_states", "return_dict")}
    wrapped = cuda_graphs.GraphedUNet(tiny_pipe.unet)
    leaves, spec = tree_flatten((x, t, kwargs["encoder_hidden_states"], extra))
    with torch.inference_mode():
        got = wrapped._call(leaves, spec)
        want = tiny_pipe.unet(x, t, encoder_hidden_states=kwargs["encoder_hidden_states"], return_dict=False)[0]
    assert torch.equal(got, want)


def test_host_overhead_splits_a_real_unet_step(scratch_reports):
    study = open_study("smoke", notebook="05_test")
    study.profile = dataclasses.replace(study.profile, repeats=2)  # a record, not a benchmark: keep it short
    h = exp.host_overhead(study)
    s = h.split
    assert h.batch == 2 and h.latent == study.profile.latent_size  # the guidance batch at the real latent
    assert h.tiny_latent == exp.smallest_latent(study.pipeline().unet) < h.latent
    assert 0 < s.python_s <= s.host_upper_s <= s.profiled_step_s  # nested bounds of the host work
    assert 0 < s.math_s < s.profiled_step_s
    for share in h.table()["percent_of_profiled_step"].dropna():
        assert 0 <= share <= 100
    assert s.aten_calls >= s.leaf_calls >= s.math_calls > 0
    assert s.device_kernels is None  # no CUDA here
    rows = read_results("smoke").set_index("metric")
    assert 0 <= rows.loc["host_share_upper", "value"] <= 100
    assert rows.loc["aten_calls_per_step", "value"] == s.aten_calls > 0


def test_the_unet_share_comes_from_the_baseline_row():
    from types import SimpleNamespace

    import pandas as pd

    from sdperf.measure.rounds import BASELINE

    summary = pd.DataFrame([{"config": BASELINE, "latency_s": 2.0, "unet_step_s": 0.3, "iterations": 5}])
    measured = SimpleNamespace(row=lambda c: summary.set_index("config").loc[c].to_dict())
    share = exp.unet_share(SimpleNamespace(measured=measured, method="m")).iloc[0]
    assert share.unet_s == pytest.approx(1.5) and share.unet_share_percent == pytest.approx(75.0)
    assert share.ceiling_speedup_if_unet_were_free == pytest.approx(4.0)
