"""TensorRT fp16: an engine for one GPU, the fastest kernel of each fused layer chosen by timing candidates.

ONNX -> TensorRT builder: the UNet exported like the ONNX Runtime rung, parsed by `trt.OnnxParser`, built with
`BuilderFlag.FP16` (tensorrt 10.x) and one optimization profile spanning the study's batch sizes, and run with
`execute_async_v3` on torch's current CUDA stream.
"""
from __future__ import annotations

import time

import torch

from sdperf.optimizations.unet_graph import INPUTS, OUTPUT, EngineUNet, export_onnx, scratch_dir

PACKAGES = ("onnx", "onnxscript", "tensorrt-cu13", "tensorrt-cu13-bindings")

PRECISIONS = ("fp16",)
WORKSPACE_BYTES = 8 << 30  # builder scratch for tactic timing; SD UNets need a few GiB for the attention tactics


def availability(device: str) -> tuple[bool, str]:
    """Needs CUDA, a CUDA profile, and a tensorrt package whose builder has the fp16 flag."""
    if not torch.cuda.is_available():
        return False, ("TensorRT needs an NVIDIA GPU with CUDA; torch.cuda.is_available() is False on this "
                       "machine (its CPU counterparts are the ONNX Runtime and OpenVINO rungs)")
    if device != "cuda":
        return False, f"the profile runs the pipeline on {device}; TensorRT engines run on cuda"
    try:
        import tensorrt as trt
    except ImportError:
        return False, ("the tensorrt Python package is not installed (`make install-gpu` installs TensorRT 10 from "
                       "requirements-gpu.lock; a plain `pip install tensorrt` gets the newest, 11.x, and this path "
                       "needs 10.x)")
    if not hasattr(trt.BuilderFlag, "FP16"):
        return False, f"tensorrt {trt.__version__} has no BuilderFlag.FP16 (strongly typed only); this path needs 10.x"
    return True, f"tensorrt {trt.__version__} on {torch.cuda.get_device_name(0)}"


def _profile(builder, example: tuple, batches: tuple[int, int, int]):
    """One optimization profile: UNet batch from min to max, tuned for opt; other dimensions fixed."""
    profile = builder.create_optimization_profile()
    for name, x in zip(INPUTS, example):
        if x.dim() == 0:
            continue
        profile.set_shape(name, *[(b, *x.shape[1:]) for b in batches])
    return profile


def build_engine(onnx_path, example: tuple, batches: tuple[int, int, int]):
    """Parse the ONNX file (external weights next to it), build an fp16 engine; returns (runtime, engine):
    the runtime must outlive the engine it deserialized."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse the exported UNet: {errors}")
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    config.add_optimization_profile(_profile(builder, example, batches))
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT's builder returned no engine (see the TensorRT log above)")
    runtime = trt.Runtime(logger)
    return runtime, runtime.deserialize_cuda_engine(serialized)


def build(unet: torch.nn.Module, example: tuple, *, batches: tuple[int, int, int] | None = None,
          exporter: str = "dynamo", scratch_root=None) -> EngineUNet:
    """Export (fp32 ONNX), build the fp16 engine for UNet batches `batches` = (min, opt, max), wrap it."""
    import tensorrt as trt

    b = int(example[0].shape[0])
    batches = batches or (b, b, b)
    with scratch_dir(scratch_root) as tmp:
        facts = export_onnx(unet, example, tmp / "unet.onnx", exporter)
        if not facts["dynamic_batch"]:
            batches = (b, b, b)
        t0 = time.perf_counter()
        runtime, engine = build_engine(tmp / "unet.onnx", example, batches)
        facts["build_s"] = time.perf_counter() - t0
    facts.update(engine=f"tensorrt {trt.__version__}", precision="fp16", profile_batches=list(batches))
    context = engine.create_execution_context()

    def run(feeds: dict) -> torch.Tensor:
        keep = {k: v.to("cuda").contiguous() for k, v in feeds.items()}  # alive until the stream has run
        for name, x in keep.items():
            context.set_input_shape(name, tuple(x.shape))
            context.set_tensor_address(name, x.data_ptr())
        out = torch.empty(tuple(context.get_tensor_shape(OUTPUT)), device="cuda", dtype=torch.float32)
        context.set_tensor_address(OUTPUT, out.data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return out

    return EngineUNet(run, unet.config, device="cuda", facts=facts, keep=(runtime, engine, context))
