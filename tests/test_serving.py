"""The two serving designs on the tiny SD pipeline: same images as generate() for the same seeds, a failing
request isolated, and the profile's serving section validated."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.model.generation import Workload, generate
from sdperf.config.profiles import available_profiles, load_profile
from sdperf.serving import serving_settings
from sdperf.serving.stages import Request, SDStages, build_design


@pytest.fixture(scope="module")
def sd(tiny_pipe, smoke):
    return SDStages(tiny_pipe, Workload.from_profile(smoke, 1))


def _reference(pipe, template: Workload, seeds: tuple[int, ...]) -> torch.Tensor:
    """generate() on consecutive seeds: its images i use seed + i, as a request's images use their own seeds."""
    assert seeds == tuple(range(seeds[0], seeds[0] + len(seeds)))
    wl = dataclasses.replace(template, batch_size=len(seeds), seed=seeds[0])
    return generate(pipe, wl).images


@pytest.mark.parametrize("design", ["stacked", "staged"])
def test_designs_give_generates_images_for_the_same_seeds(design, sd, tiny_pipe):
    requests = [Request((5,)), Request((7, 8)), Request((6,))]
    with build_design(design, sd, concurrency=2, queue_depth=1) as server:
        futures = [server.submit(r) for r in requests]
        out = [f.result(timeout=120) for f in futures]
    for r, images in zip(requests, out):
        assert torch.equal(images, _reference(tiny_pipe, sd.template, r.seeds)), r


def test_a_request_failing_mid_stage_reaches_its_caller_only(sd, tiny_pipe):
    class Broken(SDStages):
        def denoise(self, p):
            if p["workload"].seed == 13:
                raise RuntimeError("denoise failed for seed 13")
            return super().denoise(p)

    broken = Broken(tiny_pipe, sd.template)
    server = build_design("staged", broken, concurrency=2, queue_depth=1)
    futures = {s: server.submit(Request((s,))) for s in (11, 13, 12)}
    server.close(timeout=120)
    assert server.alive_workers == 0
    with pytest.raises(RuntimeError, match="seed 13"):
        futures[13].result(timeout=0)
    for s in (11, 12):
        assert torch.equal(futures[s].result(timeout=0), _reference(tiny_pipe, sd.template, (s,)))


def test_concurrent_requests_tokenize_one_at_a_time_and_get_their_own_padding():
    """A stand-in tokenizer that, like transformers 5's, keeps its padding on shared state set per call: two
    threads asking for max_length and for "longest" at once took each other's, and a third calling `tokenize`
    (which diffusers' encode_prompt calls first, and which sets "no padding") took theirs away; behind
    SerialTokenizer never."""
    import threading
    import time
    import types

    from sdperf.serving.stages import SerialTokenizer, serial_tokenizers

    class Shared:
        model_max_length = 77

        def __init__(self):
            self.padding, self.inside, self.most_inside = None, 0, 0

        def __call__(self, prompt, padding="longest", max_length=None):
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.padding = padding  # shared, as the Rust tokenizer's padding setting is
            time.sleep(0.002)  # the encode itself releases the GIL
            got = 77 if self.padding == "max_length" else len(prompt.split())
            self.inside -= 1
            return got

        def tokenize(self, prompt):
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.padding = None  # transformers 5: _encode_plus -> set_truncation_and_padding(DO_NOT_PAD)
            time.sleep(0.002)
            self.inside -= 1
            return prompt.split()

    def hammer(tok) -> set:
        lengths, start = set(), threading.Barrier(3)

        def ask(padding):
            start.wait()  # both threads in the loop at once, however loaded the machine
            for _ in range(60):
                n = tok("a red circle", padding=padding, max_length=77)
                lengths.add((padding, n))

        def split():
            start.wait()
            for _ in range(60):
                tok.tokenize("a red circle")
        ts = [threading.Thread(target=ask, args=(p,)) for p in ("max_length", "longest")]
        ts.append(threading.Thread(target=split))
        [t.start() for t in ts]
        [t.join() for t in ts]
        return lengths

    raw = Shared()
    assert ("max_length", 3) in hammer(raw) or ("longest", 77) in hammer(raw)  # the race, unprotected
    pipe = types.SimpleNamespace(tokenizer=Shared(), tokenizer_2=None)
    serial_tokenizers(pipe)
    serial_tokenizers(pipe)  # idempotent: one wrapper, not two
    assert isinstance(pipe.tokenizer, SerialTokenizer) and not isinstance(pipe.tokenizer._inner, SerialTokenizer)
    assert hammer(pipe.tokenizer) == {("max_length", 77), ("longest", 3)}
    assert pipe.tokenizer._inner.most_inside == 1 and pipe.tokenizer.model_max_length == 77


def test_unknown_design_names_the_choices(sd):
    with pytest.raises(ValueError, match=r"'pipelined'.*stacked, staged"):
        build_design("pipelined", sd, 1, 1)


def test_every_profile_has_a_valid_serving_section():
    for name in available_profiles():
        cfg = serving_settings.load(load_profile(name, check_runtime=False))
        assert set(cfg.designs) <= set(serving_settings.DESIGNS) and min(cfg.concurrency) >= 1


def _with(smoke, **changes):
    return dataclasses.replace(smoke, serving=dict(smoke.serving, **changes))


@pytest.mark.parametrize("key,value,expected", [
    ("scenarios", ["Offline", "MultiStream"], r"scenarios entry 'MultiStream' is not valid.*Offline, Server"),
    ("designs", ["stacked", "async"], r"designs entry 'async' is not valid.*stacked, staged"),
    ("sync_schedulers", ["heun"], r"'heun' is not valid.*plms, ddim, euler, dpmpp-2m"),
    ("concurrency", [1, 0], r"concurrency entry must be an integer >= 1, got 0"),
    ("batch_sizes", [], r"batch_sizes must be a non-empty list"),
    ("server_load", -1, r"server_load must be a number > 0, got -1"),
    ("queue_depth", 1.5, r"queue_depth must be an integer >= 1, got 1.5"),
])
def test_bad_serving_values_name_value_and_choices(smoke, key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        serving_settings.load(_with(smoke, **{key: value}))


def test_unknown_and_missing_serving_keys_are_named(smoke):
    with pytest.raises(ConfigError, match=r"serving.concurrancy is not a valid key; valid keys: designs"):
        serving_settings.load(_with(smoke, concurrancy=[1]))
    partial = dataclasses.replace(smoke, serving={k: v for k, v in smoke.serving.items() if k != "repeats"})
    with pytest.raises(ConfigError, match="missing keys repeats"):
        serving_settings.load(partial)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams between stages need a GPU")
def test_staged_on_cuda_streams_gives_the_stacked_images(smoke):
    from sdperf.model.pipelines import build_pipeline

    stages = SDStages(build_pipeline(smoke, device="cuda"), Workload.from_profile(smoke, 1))
    requests = [Request((s,)) for s in range(4)]
    out = {}
    for design in ("stacked", "staged"):
        with build_design(design, stages, concurrency=3, queue_depth=1) as server:
            out[design] = [f.result(timeout=120) for f in [server.submit(r) for r in requests]]
    assert all(torch.equal(a, b) for a, b in zip(out["stacked"], out["staged"]))
