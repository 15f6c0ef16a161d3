"""The study's own text-to-image model: a captioned domain with exact ground truth and a small SD-family model.

No Stable Diffusion, CLIP or Inception weights can be downloaded here, so quality figures on random weights mean
nothing. This package generates a captioned image domain with exact ground truth (`domain`), trains a small CNN
that reads that ground truth back from an image (`evaluator`: prompt adherence and a domain FID), and trains a
latent diffusion model of Stable Diffusion's own architecture family on it (`sdref`, `train_command`), stored with
its checksums and provenance (`storage`, `manifest`) and scored by `domain_quality`. Speed is measured on SD 1.5 at
random init; quality deltas on this model, by `sdperf.judge`.

Training: `training_recipe` (every setting, checked first), `loop` (resumable, checkpointed), `first_stage` (the
autoencoder and the latents), `unet_stage` (the UNet under torchrun), `train_command` (`sdperf train-reference`).
"""
