"""Stable Diffusion UNet training throughput: one real training step, launched by torchrun (DDP) or DeepSpeed
ZeRO, swept over world sizes and per-rank batch sizes, and set beside the NeMo and MosaicML scaling tables.

Modules: `training_settings` (the profile's `training:` section, validated before anything is built), `model` (the UNet
to train), `dataset` (latents + text embeddings), `step` (noise-prediction loss, AdamW, clipping, autocast),
`zero` (DeepSpeed ZeRO config), `train` (the per-rank torchrun entry point), `launch` (one configuration in a
fresh process group, and the sweep), `scaling` (speed-up and efficiency, of the published curves too),
`figures`, `collect` (the ranks' rows gathered) and `spec` (one configuration as the ranks read it); what
11_training_scaling calls is sdperf.experiments.training_scaling.
"""
