"""CUDA graphs: capture one UNet step once, then replay it with a single launch per step.

A replay removes host work (the modules' Python, the dispatcher, every kernel launch), so graphs help when the GPU
waits for the host. A graph is recorded for fixed shapes and addresses: inputs are copied into static tensors before
each replay, and each input shape needs its own capture (PyTorch's documented torch.cuda.graphs recipe). Without
CUDA there is nothing to capture; experiments/cuda_graphs.py measures the host-side share of a UNet step instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from sdperf.optimizations.catalog import GRAPHS, Technique

WARMUP_CALLS = 3  # side-stream calls before capture: cuDNN/cuBLAS pick algorithms and workspaces outside the graph


def availability(device: str) -> tuple[bool, str]:
    """CUDA graphs need a CUDA device under the study; the reason says precisely what is missing."""
    if device != "cuda":
        return False, (f"device {device!r}: CUDA graphs record and replay kernels on a CUDA stream "
                       "(torch.cuda.CUDAGraph); a CPU runs each operator as Python calls it, so there is "
                       "nothing to capture")
    if not torch.cuda.is_available():
        return False, (f"device 'cuda' requested but torch.cuda.is_available() is False "
                       f"(torch built with CUDA {torch.version.cuda or 'none'})")
    return True, "one graph per input shape; inputs are copied into static tensors before each replay"


@dataclass
class _Capture:
    graph: "torch.cuda.CUDAGraph"
    static_leaves: list  # flattened inputs: static tensors where the call had tensors, values otherwise
    spec: object
    output: torch.Tensor


def _key(leaves: list, spec, weights: torch.Tensor) -> tuple:
    """What a graph is specialised on: the input structure, tensors' shape/dtype/device, other values, inference
    mode (its static tensors are inference tensors then), and where the weights live (fixed addresses)."""
    parts = tuple((tuple(x.shape), x.dtype, str(x.device)) if isinstance(x, torch.Tensor) else ("value", repr(x))
                  for x in leaves)
    return (str(spec), parts, torch.is_inference_mode_enabled(), weights.data_ptr(), weights.dtype)


class GraphedUNet(torch.nn.Module):
    """Drop-in for `pipe.unet`, one CUDA graph per input shape, captured on its first call; the output is cloned
    from the graph's static output, which the next replay overwrites."""

    def __init__(self, unet: torch.nn.Module, warmup: int = WARMUP_CALLS):
        super().__init__()
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (calls before capture), got {warmup}")
        self.unet = unet
        self.config = unet.config
        self.warmup = warmup
        self._graphs: dict[tuple, _Capture] = {}

    @property
    def dtype(self) -> torch.dtype:
        return next(self.unet.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.unet.parameters()).device

    @property
    def captures(self) -> int:
        """How many graphs have been captured (one per input shape seen)."""
        return len(self._graphs)

    def _inputs(self, sample, timestep, encoder_hidden_states, extra) -> tuple[list, object]:
        if not isinstance(sample, torch.Tensor) or sample.device.type != "cuda":
            where = sample.device if isinstance(sample, torch.Tensor) else type(sample).__name__
            raise ValueError(f"GraphedUNet replays CUDA graphs, so sample must be a CUDA tensor; got {where}. "
                             "Move the pipeline to 'cuda' or use the eager UNet on this device")
        if not torch.is_tensor(timestep):  # a Python number cannot be updated in place: make it a static tensor
            dtype = torch.int64 if isinstance(timestep, int) else torch.float32
            timestep = torch.tensor(timestep, dtype=dtype, device=sample.device)
        timestep = timestep.to(sample.device)  # the eager UNet moves it too; inside a graph it could not
        leaves, spec = tree_flatten((sample, timestep, encoder_hidden_states, extra))
        bad = [x.device for x in leaves if isinstance(x, torch.Tensor) and x.device != sample.device]
        if bad:
            raise ValueError(f"all UNet inputs must be on {sample.device} for graph replay; found {bad[0]}")
        return leaves, spec

    def _call(self, leaves: list, spec) -> torch.Tensor:
        sample, timestep, encoder_hidden_states, extra = tree_unflatten(leaves, spec)
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False,
                         **extra)[0]

    def _capture(self, leaves: list, spec) -> _Capture:
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self._call(static, spec)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self._call(static, spec)
        return _Capture(graph=graph, static_leaves=static, spec=spec, output=output)

    def forward(self, sample, timestep, encoder_hidden_states=None, return_dict: bool = False, **extra):
        leaves, spec = self._inputs(sample, timestep, encoder_hidden_states, extra)
        key = _key(leaves, spec, next(self.unet.parameters()))
        cap = self._graphs.get(key)
        if cap is None:  # graphs recorded against weights that have since moved can never replay again
            self._graphs = {k: g for k, g in self._graphs.items() if k[3:] == key[3:]}
            cap = self._graphs[key] = self._capture(leaves, spec)
        for dst, src in zip(cap.static_leaves, leaves):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        cap.graph.replay()
        out = cap.output.clone()
        if return_dict:
            from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

            return UNet2DConditionOutput(sample=out)
        return (out,)


def apply(pipe, warmup: int = WARMUP_CALLS):
    """Replace `pipe.unet` by a GraphedUNet; the UNet must already be on a CUDA device."""
    device = next(pipe.unet.parameters()).device
    if device.type != "cuda":
        raise ValueError(f"pipe.unet is on {device}; CUDA graphs need it on a CUDA device (pipe.to('cuda'))")
    pipe.unet = GraphedUNet(pipe.unet, warmup=warmup)
    return pipe


def techniques() -> list[Technique]:
    """cuda_graphs: the UNet step captured once per input shape and replayed."""
    return [Technique("cuda_graphs", "CUDA graph (UNet step)", GRAPHS, "05_cuda_graphs",
                      apply=lambda pipe, ctx: apply(pipe), loop_only=True, availability=lambda ctx: availability(ctx.device),
                      note="one capture per CFG batch shape; inputs copied into static tensors")]
