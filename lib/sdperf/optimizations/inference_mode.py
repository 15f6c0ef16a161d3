"""Keeping autograd out of inference: grad mode on, torch.no_grad, torch.inference_mode.

diffusers already runs a pipeline call under `torch.no_grad`; inference_mode also skips view tracking and
version-counter bumps, a per-op cost small next to Stable Diffusion's kernels. Grad mode costs almost nothing while
no parameter requires grad; with trainable networks every op keeps its inputs, and the graph of the whole denoising
loop stays alive until the output is dropped.
"""
from __future__ import annotations

import torch

from sdperf.model.generation import GRAD_MODES
from sdperf.optimizations.catalog import GRAD_MODE, Technique
from sdperf.optimizations.catalog import PARAMETERS as PARAMETERS_FAMILY

PARAMETERS = ("frozen", "trainable")

_WHAT_EACH_MODE_RECORDS = {
    "inference_mode": "records no graph and skips view tracking and version counters (tensors made inside "
                      "cannot be used by autograd later)",
    "no_grad": "records no graph; tensors still carry version counters and view tracking",
    "grad": "records a graph for every op whose inputs require grad: nothing while parameters are frozen, "
            "every activation of every step while they are trainable",
}


def _check_mode(grad_mode: str) -> None:
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"grad_mode {grad_mode!r} is not valid; choose one of: {', '.join(GRAD_MODES)}")


def availability(device: str, grad_mode: str) -> tuple[bool, str]:
    """All three modes are part of torch itself (inference_mode since 1.9) and run on every device."""
    _check_mode(grad_mode)
    return True, f"{grad_mode} on {device}: {_WHAT_EACH_MODE_RECORDS[grad_mode]}"


def apply(pipe, parameters: str = "frozen"):
    """Set requires_grad on every parameter: 'trainable' as for fine-tuning, 'frozen' as sdperf builds it."""
    if parameters not in PARAMETERS:
        raise ValueError(f"parameters {parameters!r} is not valid; choose one of: {', '.join(PARAMETERS)}")
    for module in networks(pipe):
        module.requires_grad_(parameters == "trainable")
    return pipe


def networks(pipe) -> list[torch.nn.Module]:
    return [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]


def trainable_parameters(pipe) -> dict:
    """How many of the pipeline's parameters require grad (what decides whether grad mode records anything)."""
    params = [p for m in networks(pipe) for p in m.parameters()]
    return {"parameters": sum(p.numel() for p in params),
            "requiring_grad": sum(p.numel() for p in params if p.requires_grad)}


NOTEBOOK = "02_inference_mode"
_MODE_LABELS = {"inference_mode": "inference_mode (fresh pipeline)", "no_grad": "no_grad",
                "grad": "grad on"}


def techniques() -> list[Technique]:
    """grad:<mode> runs the generation under that autograd mode (loop-only: with frozen networks nothing is
    recorded); parameters:trainable makes every parameter require grad first (not loop-only: the VAE records too)."""
    out = [Technique(f"grad:{mode}", label, GRAD_MODE, NOTEBOOK, grad_mode=mode, loop_only=True,
                     availability=lambda ctx, m=mode: availability(ctx.device, m), note=_WHAT_EACH_MODE_RECORDS[mode])
           for mode, label in _MODE_LABELS.items()]
    out.append(Technique("parameters:trainable", "parameters trainable", PARAMETERS_FAMILY, NOTEBOOK,
                         apply=lambda pipe, ctx: _trainable(pipe, ctx),
                         note="requires_grad on every parameter: what grad mode then records",
                         extra_copies=dict.fromkeys(("unet", "vae", "text_encoder", "text_encoder_2"), 1)))  # grads
    return out


def _trainable(pipe, ctx):
    apply(pipe, "trainable")
    ctx.facts.update(trainable_parameters(pipe))
    return pipe
