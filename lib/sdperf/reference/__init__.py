"""The study's own text-to-image model and the evaluator that judges it.

No Stable Diffusion, CLIP or Inception weights can be downloaded here, so quality figures on random weights mean
nothing. This package generates a captioned image domain with exact ground truth (`domain`), trains a small CNN
that reads that ground truth back from an image (`evaluator`: prompt adherence and a domain FID), and trains a
latent diffusion model of Stable Diffusion's own architecture family on it (`model`, `train`), stored with its
checksums and provenance (`store`, `manifest`) and judged by `quality`. Speed is still measured on SD 1.5 at
random init; quality deltas are measured on this model.

Training: `recipe` (every setting, checked first), `loop` (resumable, checkpointed), `first_stage` (the
autoencoder and the latents), `unet_stage` (the UNet under torchrun), `train` (`sdperf train-reference`).
Judging: `converged` (the converged fp32 solve every verdict is judged against), `paired` (paired measures and the
budget), `controls` (the twin and known harms each run carries), `techniques` (each key judged alone and stacked),
`technique_setup` (how a judged key renders: its profile, pipeline, steps and call shape), `renders` (those
renders, cached across runs of one machine),
`technique_report` (12's table and figure), `transfer` (what may carry over to SD 1.5), `curve` (NeMo's protocol
on this model).
"""
