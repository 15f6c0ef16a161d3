"""How a judged key is set up to render on the reference model: the profile its techniques see, the pipeline that
renders it alone, its steps and its call shape (sdperf.judge.techniques judges what these render).

Everything here decides a judged technique's pictures, so the render cache (sdperf.judge.renders) hashes this
module's source into its key; the judging's own logic (the time gate, the sequential test, the rows) lives in
techniques, whose edits leave the cached renders valid.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sdperf.judge import controls, converged
from sdperf.refmodel import domain, domain_quality

GUIDANCE = 7.5  # the seeds' guidance: the reference model's quality is first stated there
RENDER_BATCH = 16  # prompts per UNet call (UNet batch 32 with guidance: the exported engines' dynamic maximum)
SOLVE_BATCH = 64  # prompts per UNet call of the fp32 solves (no engine: a larger batch is several times cheaper)
# captions a calibrated int8 technique may generate from (Context.prompts): the whole-trajectory schemes stop at
# quantization.CALIBRATION_SAMPLES calls (12 captions at 25 steps), the many-caption one takes 4 calls of each
CALIBRATION_CAPTIONS = 64
CALIBRATION_SEED = 7  # its captions come from another seed than the judged ones: calibrating on the test set flatters


def profile_for(base, folder: Path, steps: int):
    """The profile the techniques see (resolution, latent size, static shapes, calibration prompt): the reference
    model's, on the CPU, at the given steps and GUIDANCE, with a domain caption as its prompt."""
    from sdperf.config.architectures import ARCHS
    from sdperf.refmodel import sdref

    side = ARCHS[sdref.ARCH].vae["sample_size"]  # the image side the reference model was trained at
    return replace(base, name=f"{base.name}-reference", arch=sdref.ARCH, resolution=side, steps=steps,
                   scheduler="plms", guidance_scale=GUIDANCE, batch_sizes=(RENDER_BATCH,), dtype="float32",
                   device="cpu", weights=str(folder), prompt=domain_quality.prompts(1)[0].caption)


def context(base, folder: Path, steps: int, scratch: Path | None, calibration_samples: int):
    """The catalog Context a technique is applied in: profile_for's profile at the engines' batch, the scratch
    folder for its artefacts, and CALIBRATION_CAPTIONS captions of CALIBRATION_SEED for a calibrated int8 scheme,
    which collects at most `calibration_samples` UNet calls from them."""
    from sdperf.optimizations.catalog import Context

    return Context(profile_for(base, folder, steps), batch_size=RENDER_BATCH, scratch=scratch, artefacts=scratch,
                   prompts=tuple(s.caption for s in domain.scenes(CALIBRATION_SEED, CALIBRATION_CAPTIONS)),
                   calibration_samples=calibration_samples)


def how(control, stack, n_converged: int) -> tuple[int, str, int, bool]:
    """(steps, grad mode, prompts per UNet call, aligned) with which a control or a stack is rendered alone: a
    sampler its own steps, anything else the converged solve's; a control at the converged solve's own batch, the
    twin also in the solve's own chunks (`aligned`: the same computation, so its deltas are exactly 0); a technique
    at RENDER_BATCH (an engine's static shapes)."""
    if control is not None:
        return (control.steps or n_converged, "inference_mode", SOLVE_BATCH,
                not control.noise and control.steps is None)
    return (stack.steps if stack.steps is not None else n_converged), stack.grad_mode, RENDER_BATCH, False


def sampler(control, stack) -> str:
    """The sampler ('<scheduler>[:<spacing>]') a control or a stack renders with: its own, else the converged
    solver's."""
    own = stack.sampler if stack is not None else None
    return own or converged.SOLVER


def build(control, stack, ctx, fresh):
    """The pipeline that renders a control or a stack alone: a stack that names its sampler starts from PLMS (its
    scheduler part replaces it), anything else from the converged solver."""
    if control is not None:
        pipe = fresh(converged.SOLVER)
        if control.noise:
            controls.add_output_noise(pipe, control.noise)
        return pipe
    return stack.apply(fresh("plms" if stack.steps is not None else converged.SOLVER), ctx)
