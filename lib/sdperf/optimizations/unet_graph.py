"""The UNet as a graph an inference engine can take, and the stand-in that puts the engine back in its place.

Engines (ONNX Runtime, OpenVINO, TensorRT) want a function of plain tensors: the timestep becomes a float32 scalar
input, not a constant baked in at export. Only the UNet, which the loop calls once per step, is exported, into a
scratch folder deleted as soon as the engine holds its own copy.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

INPUTS = ("sample", "timestep", "encoder_hidden_states")
OUTPUT = "out_sample"
CONTEXT_TOKENS = 77  # CLIP's fixed prompt length: the text context is (batch, 77, cross_attention_dim)
MAX_GRAPH_BATCH = 32  # upper bound of the dynamic batch axis (CFG doubles the images: 16 images per prompt)
EXPORTERS = ("dynamo", "torchscript")


def check_supported(config) -> None:
    """SD 1.x/2 UNets only: SDXL's UNet takes two more inputs (pooled text embeds, time ids)."""
    if config.get("addition_embed_type") is not None:
        raise ValueError(f"engine export covers SD 1.x/2 UNets; this UNet has addition_embed_type="
                         f"{config.get('addition_embed_type')!r} (SDXL), whose extra inputs the graph does not take")


class UNetGraph(torch.nn.Module):
    """UNet2DConditionModel with positional tensor inputs and one tensor output, as exporters want it."""

    def __init__(self, unet: torch.nn.Module):
        super().__init__()
        check_supported(unet.config)
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[0]


def example_inputs(config, batch: int, latent_size: int, device="cpu") -> tuple[torch.Tensor, ...]:
    """(sample, timestep, encoder_hidden_states) at the shapes the loop will call with; values do not matter."""
    g = torch.Generator("cpu").manual_seed(0)
    sample = torch.randn(batch, config.in_channels, latent_size, latent_size, generator=g)
    context = torch.randn(batch, CONTEXT_TOKENS, config.cross_attention_dim, generator=g)
    return sample.to(device), torch.tensor(999.0, device=device), context.to(device)


def graph_inputs(sample, timestep, encoder_hidden_states, extra: dict) -> dict[str, torch.Tensor]:
    """The pipeline's UNet call turned into the graph's named float32 inputs."""
    if extra:
        raise ValueError(f"this engine's graph takes only {', '.join(INPUTS)}; got extra UNet arguments "
                         f"{', '.join(sorted(extra))}")
    t = torch.as_tensor(timestep, device=sample.device).to(torch.float32).reshape(())
    return {"sample": sample.float().contiguous(), "timestep": t,
            "encoder_hidden_states": encoder_hidden_states.float().contiguous()}


def float32_unet(unet: torch.nn.Module) -> torch.nn.Module:
    """The UNet an exporter traces: float32, like the graph's inputs (a half-precision UNet is copied up; the
    engine's precision setting decides what it computes in)."""
    if next(unet.parameters()).dtype == torch.float32:
        return unet
    import copy

    return copy.deepcopy(unet).float()


class EngineUNet:
    """Stands in for `pipe.unet`: the same call and config, the graph run by an engine. `run` maps the named graph
    inputs to the output; `facts` says how the engine was made; `keep` holds what its memory depends on."""

    dtype = torch.float32

    def __init__(self, run: Callable[[dict], torch.Tensor], config, device: str = "cpu", facts: dict | None = None,
                 keep: tuple = ()):
        self._run = run
        self.config = config
        self.device = torch.device(device)
        self.facts = dict(facts or {})
        self._keep = keep

    def __call__(self, sample, timestep, encoder_hidden_states=None, return_dict: bool = False, **extra):
        out = self._run(graph_inputs(sample, timestep, encoder_hidden_states, extra)).to(sample.dtype)
        if return_dict:
            from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

            return UNet2DConditionOutput(sample=out)
        return (out,)

    def __repr__(self) -> str:
        return f"EngineUNet({self.facts.get('engine', '?')}, device={self.device})"


@contextlib.contextmanager
def scratch_dir(root: Path | str | None = None):
    """A fresh dot-prefixed folder for exported files (kept out of git), deleted on exit whatever happens."""
    if root is not None:
        Path(root).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".engine-export-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20


def export_onnx(unet: torch.nn.Module, example: tuple, path: Path, exporter: str = "dynamo") -> dict:
    """torch.onnx.export of the UNet with a dynamic batch axis ('dynamo' or the legacy 'torchscript' tracer),
    weights as external data next to `path`, which must sit in a folder of its own (scratch_dir). Without a
    dynamic batch axis the graph is exported at the example's batch and `dynamic_batch` says so."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter {exporter!r} is not valid; choose one of: {', '.join(EXPORTERS)}")
    graph = UNetGraph(unet).eval()
    facts = {"exporter": exporter, "dynamic_batch": True}
    t0 = time.perf_counter()
    try:
        _export(graph, example, path, exporter, dynamic=True)
    except Exception as exc:  # any exporter failure on the dynamic axis: recorded, then a static export
        facts.update(dynamic_batch=False, dynamic_batch_error=f"{type(exc).__name__}: {str(exc)[:200]}")
        for f in Path(path).parent.iterdir():
            if f.is_file():
                f.unlink()
        _export(graph, example, path, exporter, dynamic=False)
    facts["export_s"] = time.perf_counter() - t0
    facts["export_mib"] = folder_mib(Path(path).parent)
    facts["export_batch"] = int(example[0].shape[0])
    return facts


def _export(graph, example, path, exporter: str, dynamic: bool) -> None:
    kw = dict(input_names=list(INPUTS), output_names=[OUTPUT])
    # the exporters' expected warnings are filtered in sdperf.core.quiet
    with torch.inference_mode(False), torch.no_grad():
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=MAX_GRAPH_BATCH)
            shapes = {"sample": {0: batch}, "timestep": None, "encoder_hidden_states": {0: batch}}
            torch.onnx.export(graph, example, str(path), dynamo=True, external_data=True, verbose=False,
                              dynamic_shapes=shapes if dynamic else None, **kw)
        else:
            axes = {n: {0: "batch"} for n in ("sample", "encoder_hidden_states", OUTPUT)}
            torch.onnx.export(graph, example, str(path), dynamo=False, opset_version=17,
                              dynamic_axes=axes if dynamic else None, **kw)
