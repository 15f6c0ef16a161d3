"""Count the device-to-host syncs of each denoising step, before and after keeping scheduler values on the host.

A read-back (`.item()`, `.tolist()`, `bool(tensor)`, `int(tensor)`, `.cpu()`, `.nonzero()`, index by a 0-d tensor)
of a device tensor makes the host wait for everything queued before it, and the GPU idles meanwhile (the seed's
"comparing tensors and Python floats"). `SyncCounter`, a torch function mode, sees those calls on any device. On an
accelerator a tensor's `.device` says where it lives; on a CPU the counter follows what the loop puts on the device
(latents, text embeddings and, in diffusers' loop, the timesteps) through every op computed from them, so the count
is what the same code does on a GPU (tensors a model makes from Python numbers in its forward are not followed). On
CUDA, `torch.cuda.set_sync_debug_mode("warn")` counts driver-level syncs as a second opinion.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import sys
import types
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from sdperf.model.generation import Workload, denoise, encode, initial_latents, module_dtype, no_clock
from sdperf.model.pipelines import make_scheduler

# Calls that return a host value computed from a tensor's contents (or a shape that depends on them).
READ_BACK = {"item": ".item()", "tolist": ".tolist()", "__bool__": "bool(tensor)", "__int__": "int(tensor)",
             "__float__": "float(tensor)", "__index__": "tensor as index", "__complex__": "complex(tensor)",
             "numpy": ".numpy()", "__array__": "np.asarray(tensor)", "nonzero": ".nonzero()",
             "argwhere": "argwhere", "masked_select": "masked_select", "unique": "unique", "equal": "torch.equal",
             "allclose": "allclose", "is_nonzero": "is_nonzero", "cpu": ".cpu()"}
_TO_CPU = ".to('cpu')"
_TO_HOST = (READ_BACK["cpu"], _TO_CPU)  # read-backs whose result is a host tensor
VARIANTS = ("diffusers loop", "host values")
_SKIP_FRAMES = ("/torch/", "sync_audit.py", "contextlib.py")


def _is_host_target(args, kwargs) -> bool:
    """`.to(...)` towards the CPU."""
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu":
            return True
    return False


def _call_site() -> str:
    """file:function of the first frame outside torch and this module: where the read-back is written."""
    frame = sys._getframe(2)
    while frame is not None and any(s in frame.f_code.co_filename for s in _SKIP_FRAMES):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"


@dataclass
class SyncEvent:
    step: int  # -1 before the first step (set-up)
    stage: str  # "setup" (before the first step), "unet", "scheduler" or "loop" (between them)
    op: str
    site: str


class SyncCounter(TorchFunctionMode):
    """Counts read-backs of device tensors; use `clock` as generation.denoise's clock to attribute them to steps."""

    def __init__(self):
        super().__init__()
        self.events: list[SyncEvent] = []
        self.cuda_counts: collections.Counter = collections.Counter()  # (step, stage) -> syncs torch warned about
        self._resident: dict[int, weakref.ref] = {}
        self._step, self._stage = -1, "setup"
        self._cuda_caught: list | None = None

    def place(self, *tensors) -> None:
        """Mark tensors as living on the device (needed on a CPU only; on an accelerator `.device` says it)."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                key = id(t)
                self._resident[key] = weakref.ref(t, lambda _, k=key: self._resident.pop(k, None))

    def resident(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if t.device.type != "cpu":
            return True
        ref = self._resident.get(id(t))
        return ref is not None and ref() is t

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = self._read_back(func, args, kwargs)
        if op is not None:
            self.events.append(SyncEvent(self._step, self._stage, op, _call_site()))
        out = func(*args, **kwargs)
        if op not in _TO_HOST and any(self.resident(t) for t in tree_leaves((args, kwargs))):
            self.place(out)  # computed from device tensors: on the device too
        return out

    def _read_back(self, func, args, kwargs) -> str | None:
        name = getattr(func, "__name__", "")
        if not args:
            return None
        if name == "__getitem__":
            for idx in tree_leaves(args[1:]):
                if self.resident(idx) and (idx.dtype == torch.bool or idx.dim() == 0):
                    return "index by a device scalar/mask"
            return None
        if not self.resident(args[0]):
            return None
        if name == "to":  # on a CPU `.to(x.device)` names the CPU too: only a real device -> host copy counts
            return _TO_CPU if args[0].device.type != "cpu" and _is_host_target(args, kwargs) else None
        return READ_BACK.get(name)

    @contextlib.contextmanager
    def clock(self, stage: str):
        """generation.denoise's per-stage clock: each 'unet' opens a new step."""
        if stage == "unet":
            self._step += 1
        self._stage = stage
        n0 = len(self._cuda_caught) if self._cuda_caught is not None else 0
        try:
            yield
        finally:
            if self._cuda_caught is not None:
                self.cuda_counts[(self._step, stage)] += len(self._cuda_caught) - n0
            self._stage = "loop"  # between the clocked parts of a step

    @contextlib.contextmanager
    def cuda_debug_mode(self):
        """CUDA only: torch's own sync detector ('warn' mode) alongside the function mode."""
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._cuda_caught = caught
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
                self.cuda_counts[(-1, "total")] = sum("synchroniz" in str(w.message) for w in caught)

    @property
    def steps(self) -> int:
        """Steps the loop ran (PLMS runs one more than asked: its first step is taken twice)."""
        return self._step + 1

    def per_step(self) -> list[int]:
        counts = collections.Counter(e.step for e in self.events)
        return [counts.get(i, 0) for i in range(self.steps)]


@dataclass
class LoopInputs:
    """What the loop starts from, made once so every variant denoises the same noise with the same text."""

    workload: Workload
    latents: torch.Tensor
    embeds: torch.Tensor
    extra: dict

    @classmethod
    def make(cls, pipe, workload: Workload) -> "LoopInputs":
        device = next(pipe.unet.parameters()).device
        with torch.inference_mode():
            embeds, extra = encode(pipe, workload, device)
            latents = initial_latents(pipe, workload).to(device, module_dtype(pipe.unet))
        return cls(workload, latents, embeds, extra)


def _view(pipe, scheduler: str, counter: SyncCounter | None):
    """The UNet with a private scheduler of the given kind; in diffusers' loop its timesteps go to the device."""
    sched = make_scheduler(scheduler, dict(pipe.scheduler.config))
    if counter is not None:
        original = sched.set_timesteps

        def set_timesteps(*args, **kwargs):
            original(*args, **kwargs)
            if kwargs.get("device", args[1] if len(args) > 1 else None) not in (None, "cpu"):
                counter.place(sched.timesteps)  # where diffusers' loop puts them: the device

        sched.set_timesteps = set_timesteps
    return types.SimpleNamespace(unet=pipe.unet, scheduler=sched)


def run_loop(pipe, inputs: LoopInputs, variant: str, scheduler: str, counter: SyncCounter | None = None):
    """One denoising loop, the study's own (`generation.denoise`, as diffusers' pipelines run it) or with host
    values; under `counter` when given (which then also marks what the loop puts on the device)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not valid; choose one of: {', '.join(VARIANTS)}")
    view = _view(pipe, scheduler, counter)
    loop = functools.partial(denoise, host_values=variant != VARIANTS[0])
    clock = counter.clock if counter is not None else no_clock
    with torch.inference_mode():
        if counter is None:
            return loop(view, inputs.workload, inputs.latents, inputs.embeds, inputs.extra)
        counter.place(inputs.latents, inputs.embeds, inputs.extra)
        with counter:
            return loop(view, inputs.workload, inputs.latents, inputs.embeds, inputs.extra, clock=clock)


def count(pipe, inputs: LoopInputs, variant: str, scheduler: str) -> SyncCounter:
    """The sync events of one loop (and on CUDA the debug mode's count beside them)."""
    counter = SyncCounter()
    cuda = inputs.latents.is_cuda
    with counter.cuda_debug_mode() if cuda else contextlib.nullcontext():
        run_loop(pipe, inputs, variant, scheduler, counter)
    return counter
