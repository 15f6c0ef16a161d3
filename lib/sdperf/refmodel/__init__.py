"""The study's own text-to-image model: a captioned domain with exact ground truth and a small SD-family model.

No SD, CLIP or Inception weights can be downloaded here, and quality on random weights means nothing. So this
package generates a captioned domain (`domain`), trains a CNN that reads its ground truth back (`evaluator`:
adherence and a domain FID) and a latent diffusion model of SD's architecture family on it (`sdref`), stored with
checksums and provenance (`storage`, `manifest`) and scored by `domain_quality`; `sdperf.judge` judges on it.
Training: `training_recipe` (every setting, checked first), `loop` (resumable, checkpointed), `first_stage` (the
autoencoder and the latents), `unet_stage` (the UNet under torchrun), `train_command` (`sdperf train-reference`).
Its students (`sdperf train-student`): `student_recipe` (their settings), `distillation` (their data and training
steps), `student_command` (train, judge, store with a manifest, load onto the teacher's pipeline).
"""
