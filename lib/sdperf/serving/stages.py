"""Stable Diffusion cut into the three serving stages, built on sdperf.model.generation, and the two designs.

A request is a batch of images, one seed each. Its latents come from its own seeds exactly as
`generation.initial_latents` makes them (seed per image), and the stages call `generation.encode`, `denoise` and
`decode`: so a batch-1 request with seed s gives the image `generate()` gives for seed s, whichever design runs it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import types
from dataclasses import dataclass

import torch

from sdperf.model.generation import Workload, decode, denoise, encode, initial_latents, module_device, module_dtype
from sdperf.model.pipelines import is_sdxl
from sdperf.serving.pipeline import Stage, StagePipeline
from sdperf.serving.serving_settings import DESIGNS


@dataclass(frozen=True)
class Request:
    seeds: tuple[int, ...]  # one image per seed; the batch size is len(seeds)

    def __post_init__(self):
        if not self.seeds:
            raise ValueError("a request needs at least one seed")


def workload_for(template: Workload, request: Request) -> Workload:
    return dataclasses.replace(template, batch_size=len(request.seeds), seed=request.seeds[0])


def request_latents(pipe, template: Workload, request: Request) -> torch.Tensor:
    """Each image's noise from its own seed (CPU float32, as generation.initial_latents makes it)."""
    one = [initial_latents(pipe, dataclasses.replace(template, batch_size=1, seed=s)) for s in request.seeds]
    return torch.cat(one)


_TOKENIZING = threading.RLock()  # one for every tokenizer of the process: pipelines share theirs (lru_cache)


class SerialTokenizer:
    """A tokenizer whose calls, and its methods' calls, run one at a time: transformers 5's CLIPTokenizer sets its
    padding and truncation per call on the shared Rust tokenizer, so concurrent requests can take each other's
    (encode_prompt asks for max_length 77, then "longest"; its `tokenize` call, textual inversion's
    maybe_convert_prompt, sets "no padding") and get short embeddings. Plain attributes pass through."""

    def __init__(self, tokenizer):
        object.__setattr__(self, "_inner", tokenizer)

    def __call__(self, *args, **kwargs):
        with _TOKENIZING:
            return self._inner(*args, **kwargs)

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not callable(value) or isinstance(value, type):
            return value

        def serial(*args, **kwargs):
            with _TOKENIZING:
                return value(*args, **kwargs)
        return serial


def serial_tokenizers(pipe) -> None:
    """Put every tokenizer of `pipe` behind SerialTokenizer (set past diffusers' module registry: the pipeline's
    config still names the tokenizer it was built with)."""
    for name in ("tokenizer", "tokenizer_2"):
        tok = getattr(pipe, name, None)
        if tok is not None and not isinstance(tok, SerialTokenizer):
            object.__setattr__(pipe, name, SerialTokenizer(tok))


class SDStages:
    """encode -> denoise -> decode for one pipeline and one workload template (prompt, steps, size, guidance); the
    payload between stages is a dict of device tensors, and only decode's output comes back to the host."""

    def __init__(self, pipe, template: Workload):
        self.pipe, self.template = pipe, template
        serial_tokenizers(pipe)  # requests encode concurrently in both designs
        self.device, self.dtype = module_device(pipe.unet), module_dtype(pipe.unet)
        # SDXL's fp16 VAE is cast to fp32 and back around each decode: concurrent decodes must not interleave
        upcast = (is_sdxl(pipe) and module_dtype(pipe.vae) == torch.float16
                  and getattr(pipe.vae.config, "force_upcast", False))
        self._decode_guard = threading.Lock() if upcast else contextlib.nullcontext()

    def encode(self, request: Request) -> dict:
        workload = workload_for(self.template, request)
        embeds, extra = encode(self.pipe, workload, self.device)
        latents = request_latents(self.pipe, self.template, request).to(self.device, self.dtype)
        return {"workload": workload, "embeds": embeds, "extra": extra, "latents": latents}

    def denoise(self, p: dict) -> dict:
        # a private scheduler per request: schedulers keep per-run state (PLMS's past outputs, step index)
        view = types.SimpleNamespace(unet=self.pipe.unet, scheduler=copy.deepcopy(self.pipe.scheduler))
        return {"latents": denoise(view, p["workload"], p["latents"], p["embeds"], p["extra"])}

    def decode(self, p: dict) -> torch.Tensor:
        """Images in [0, 1], float32 NCHW on the host: the one device-to-host copy of the request."""
        with self._decode_guard:
            images = decode(self.pipe, p["latents"])
        return images.detach().cpu()

    def end_to_end(self, request: Request) -> torch.Tensor:
        return self.decode(self.denoise(self.encode(request)))


def stacked(stages: SDStages, concurrency: int) -> StagePipeline:
    """The baseline: each request runs end to end on one worker; `concurrency` workers share the models and,
    on CUDA, the default stream (what a plain thread-per-request server does)."""
    return StagePipeline([Stage("end_to_end", stages.end_to_end, workers=concurrency)], max_in_flight=concurrency,
                         queue_depth=concurrency, device=stages.device.type, streams=False, name="stacked")


def staged(stages: SDStages, concurrency: int, queue_depth: int) -> StagePipeline:
    """One worker per stage, bounded queues between them, one CUDA stream per stage; at most `concurrency`
    requests inside at once (so 1 means no overlap: the stacked baseline's order of work)."""
    parts = [Stage("text_encoder", stages.encode), Stage("denoise", stages.denoise), Stage("vae_decode", stages.decode)]
    return StagePipeline(parts, max_in_flight=concurrency, queue_depth=queue_depth, device=stages.device.type,
                         streams=True, name="staged")


def build_design(name: str, stages: SDStages, concurrency: int, queue_depth: int) -> StagePipeline:
    if name not in DESIGNS:
        raise ValueError(f"design {name!r} is not valid; choose one of: {', '.join(DESIGNS)}")
    return stacked(stages, concurrency) if name == "stacked" else staged(stages, concurrency, queue_depth)
