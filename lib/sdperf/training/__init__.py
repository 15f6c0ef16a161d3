"""Stable Diffusion UNet training throughput: one real training step, launched by torchrun (DDP) or DeepSpeed ZeRO,
swept over world sizes and per-rank batch sizes, and set beside the NeMo and MosaicML scaling tables.

Modules: `training_settings` (the profile's `training:` section), `model` (the UNet to train), `dataset` (latents +
text embeddings), `step` (loss, AdamW, clipping, autocast), `zero` (DeepSpeed ZeRO config), `train` (the per-rank
torchrun entry point), `launch` (one configuration in a fresh process group, and the sweep), `scaling` (speed-up and
efficiency), `figures`, `collect` (the ranks' rows gathered) and `spec` (one configuration as the ranks read it);
11_training_scaling calls sdperf.experiments.training_scaling.
"""
