"""Every technique the study measures, one module per optimization step, each with the same shape:
`availability(...)` says whether it can run on this device and why not, `apply(pipe, ...)` returns the optimized
pipeline, and `techniques()` declares its catalog entries.

- catalog: every technique declared once and found by key (a stack of keys is a configuration)
- the steps: half_precision, inference_mode, attention, token_merging, torch_compile, cuda_graphs,
  deepspeed_inference (with deepspeed_policies, the policies DeepSpeed would apply, and deepspeed_clip, the CLIP
  layout adapter both use), engine_export (onnx_runtime, openvino_engine, tensorrt_engine on unet_graph, the UNet
  as an engine takes it), stage_engines (text encoder and VAE decoder through OpenVINO), quantization, fewer_steps
  (schedulers), feature_reuse (DeepCache), distilled (step-distilled students of the reference model and a tiny
  decoder), guidance_cuts (classifier-free guidance on some steps only), allocator, calibration (a known cost that
  checks the method)
- artefacts: exported engines kept on disk between the worker processes of one comparison

May import: model/, config/, store/, core/, the stage timer (measure.timing), refmodel/ (the students) and one
another; never report/, run/ or experiments/. The measuring method (measure/) builds configurations from them.
"""
