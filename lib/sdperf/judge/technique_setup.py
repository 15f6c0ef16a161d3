"""How a judged key is set up to render on the reference model: the profile its techniques see, its pipeline,
steps and call shape. All of it decides the pictures, so the render cache hashes this module's source (the
judging's own logic lives in sdperf.judge.techniques, whose edits leave the cached renders valid).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sdperf.judge import controls, converged
from sdperf.refmodel import domain, domain_quality

GUIDANCE = 7.5  # the seeds' guidance: the reference model's quality is first stated there
RENDER_BATCH = 16  # prompts per UNet call (UNet batch 32 with guidance: the exported engines' dynamic maximum)
SOLVE_BATCH = 64  # prompts per UNet call of the fp32 solves (no engine: a larger batch is several times cheaper)
CALIBRATION_CAPTIONS = 64  # captions a calibrated int8 technique may generate from (Context.prompts)
CALIBRATION_SEED = 7  # its captions come from another seed than the judged ones: calibrating on the test set flatters


def profile_for(base, folder: Path, steps: int):
    """The profile the techniques see: the reference model's on the CPU at `steps` and GUIDANCE, a caption as prompt."""
    from sdperf.config.architectures import ARCHS
    from sdperf.refmodel import sdref

    side = ARCHS[sdref.ARCH].vae["sample_size"]  # the image side the reference model was trained at
    return replace(base, name=f"{base.name}-reference", arch=sdref.ARCH, resolution=side, steps=steps,
                   scheduler="plms", guidance_scale=GUIDANCE, batch_sizes=(RENDER_BATCH,), dtype="float32",
                   device="cpu", weights=str(folder), prompt=domain_quality.prompts(1)[0].caption)


def context(base, folder: Path, steps: int, scratch: Path | None, calibration_samples: int):
    """The catalog Context a technique is applied in: profile_for's, its scratch folder and calibration captions."""
    from sdperf.optimizations.catalog import Context

    return Context(profile_for(base, folder, steps), batch_size=RENDER_BATCH, scratch=scratch, artefacts=scratch,
                   prompts=tuple(s.caption for s in domain.scenes(CALIBRATION_SEED, CALIBRATION_CAPTIONS)),
                   calibration_samples=calibration_samples)


def how(control, stack, n_converged: int) -> tuple[int, str, int, bool]:
    """(steps, grad mode, prompts per UNet call, aligned) of a control or a stack alone: a control at the solve's
    batch, the twin also in its chunks (`aligned`: its deltas exactly 0); a technique at RENDER_BATCH."""
    if control is not None:
        return control.steps or n_converged, "inference_mode", SOLVE_BATCH, not control.noise and control.steps is None
    return (stack.steps if stack.steps is not None else n_converged), stack.grad_mode, RENDER_BATCH, False


def sampler(control, stack) -> str:
    """The sampler a control or a stack renders with: its own, else the converged solver's."""
    own = stack.sampler if stack is not None else None
    return own or converged.SOLVER


def build(control, stack, ctx, fresh):
    """The pipeline of a control or a stack alone: from PLMS where a stack's sampler replaces it, else SOLVER."""
    if control is not None:
        pipe = fresh(converged.SOLVER)
        if control.noise:
            controls.add_output_noise(pipe, control.noise)
        return pipe
    return stack.apply(fresh("plms" if stack.steps is not None else converged.SOLVER), ctx)


def inputs_digest(stack, folder: Path) -> str:
    """The files a stack renders from beyond the reference model's: each student's manifest (which hashes its
    weights) beside `folder`, so a retrained student is a new render-cache key. '' for every other stack."""
    import hashlib

    from sdperf.optimizations.distilled import student_kind
    from sdperf.refmodel.student_recipe import FOLDERS

    kinds = {student_kind(t.key) for t in (stack.techniques if stack is not None else ())} - {None}
    parts = []
    for kind in sorted(kinds):
        manifest = Path(folder).parent / FOLDERS[kind] / "manifest.json"
        parts.append(hashlib.sha256(manifest.read_bytes()).hexdigest()[:16] if manifest.is_file() else "missing")
    return "+" + "+".join(parts) if parts else ""
