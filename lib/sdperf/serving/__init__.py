"""Serving Stable Diffusion: a stage pipeline beside the stacked baseline, driven by MLPerf LoadGen, and an audit of
the device-to-host syncs in the denoising loop (the Google Cloud pipeline seed, notebook 13_serving).

Modules: serving_settings (the profile's `serving:` section), pipeline (the generic engine: worker threads per stage,
bounded queues, futures, CUDA streams), stages (SD cut into text encoder / denoise / VAE decode on
sdperf.model.generation, and the two designs), loadgen_run (the LoadGen SUT and one test run, its figures read from
LoadGen's own log), sync_audit (a torch function mode counting read-backs per denoising step, and the loop with host
values), sharing (the GPU-sharing paper estimate: MIG, time-sharing, MPS). 13 calls sdperf.experiments.serving.
"""
