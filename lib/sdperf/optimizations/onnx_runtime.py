"""ONNX export + ONNX Runtime: the CPU counterpart of the TensorRT rung, in fp32 (the win is fusion and layout).

The UNet is exported once with a dynamic batch axis and run by the CPU execution provider with every graph
optimization on (ORT_ENABLE_ALL) and as many intra-op threads as torch uses.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from sdperf.optimizations import artefacts
from sdperf.optimizations.unet_graph import OUTPUT, EngineUNet, export_onnx, scratch_dir

# what a key run by this engine imports (onnxruntime-gpu is the GPU lock's)
PACKAGES = ("onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu")

PRECISIONS = ("fp32",)
PROVIDER = "CPUExecutionProvider"


def availability(device: str) -> tuple[bool, str]:
    """Runs wherever onnxruntime is installed, on the CPU (this notebook measures TensorRT on GPUs)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False, "the onnxruntime package is not installed"
    if device != "cpu":
        return False, (f"this rung runs ONNX Runtime's {PROVIDER}, a CPU engine; on {device} the engine measured "
                       "is TensorRT")
    return True, f"onnxruntime {ort.__version__}, {PROVIDER}, graph optimization level ALL"


def session(path: Path, threads: int | None = None):
    """An InferenceSession on the CPU EP with every graph optimization and torch's thread count."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    return ort.InferenceSession(str(path), opts, providers=[PROVIDER])


def build(unet: torch.nn.Module, example: tuple, *, exporter: str = "dynamo", scratch_root=None) -> EngineUNet:
    """Export the UNet and load it into a session; with `scratch_root` the graph is kept in the artefact cache."""
    import onnxruntime as ort

    if scratch_root is None:
        with scratch_dir(None) as tmp:
            facts = export_onnx(unet, example, tmp / "unet.onnx", exporter)
            t0 = time.perf_counter()
            sess = session(tmp / "unet.onnx")
            facts["build_s"] = time.perf_counter() - t0
    else:
        key = artefacts.cache_key("onnx", unet, exporter=exporter, shapes=[tuple(x.shape) for x in example])
        folder, facts, hit = artefacts.cached(scratch_root, key,
                                              lambda d: export_onnx(unet, example, d / "unet.onnx", exporter))
        facts = dict(facts, artefact=artefacts.origin(facts, hit, "exported"))
        if hit:
            facts["export_s"] = 0.0
        t0 = time.perf_counter()
        sess = session(folder / "unet.onnx")
        facts["build_s"] = time.perf_counter() - t0
    facts.update(engine=f"onnxruntime {ort.__version__}", provider=PROVIDER, precision="fp32",
                 threads=torch.get_num_threads())
    batch = facts["export_batch"]

    def run(feeds: dict) -> torch.Tensor:
        if not facts["dynamic_batch"] and feeds["sample"].shape[0] != batch:
            raise ValueError(f"this ONNX graph was exported for UNet batch {batch} only (the dynamic batch export "
                             f"failed: {facts['dynamic_batch_error']}); apply it again for batch "
                             f"{feeds['sample'].shape[0]}")
        out = sess.run([OUTPUT], {k: v.detach().cpu().numpy() for k, v in feeds.items()})[0]
        return torch.from_numpy(out)

    return EngineUNet(run, unet.config, device="cpu", facts=facts)
