"""Known, harmless warnings and log lines of the pinned libraries, filtered once (`import sdperf` calls install()):
each by exact message, category and module (or logger), with why it is harmless; anything else still shows.
"""
from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KnownWarning:
    """One warnings.warn call as filterwarnings matches it (category 'module:Class'), and why it is harmless."""

    message: str
    category: str
    module: str
    why: str


@dataclass(frozen=True)
class KnownLogRecord:
    """One logger.warning call: the logger, a regex searched in the formatted message, why it is harmless here."""

    logger: str
    message: str
    why: str


WARNINGS = (
    KnownWarning(r"IProgress not found\. Please update jupyter and ipywidgets", "tqdm:TqdmWarning", r"",
                 "tqdm.auto looks for ipywidgets inside a kernel; the notebooks run headless without progress "
                 "bars. Attributed to whichever module imported tqdm.auto first, so matched by message only."),
    KnownWarning(r'install "ipywidgets" for Jupyter support', "builtins:UserWarning", r"rich\.live",
                 "NNCF draws its quantization progress with rich, which asks for ipywidgets; the bar is discarded."),
    KnownWarning(r"torch\._dynamo\.config\.inline_inbuilt_nn_modules is deprecated", "builtins:FutureWarning",
                 r"openvino\.", "importing openvino.torch (the compile:openvino backend) sets a Dynamo flag that "
                 "torch 2.14 ignores: it always inlines nn.Modules, which is what the flag asked for."),
    KnownWarning(r"`torch\.jit\.trace(_method)?` is deprecated", "builtins:FutureWarning", r"torch\.jit\._trace",
                 "the ONNX and OpenVINO engines are made from a deliberate torch.jit.trace (the pinned "
                 "openvino.convert_model takes a traced module); the deprecation says nothing about the graph."),
    KnownWarning(r"Converting a tensor to a Python boolean might cause the trace to be incorrect",
                 "builtins:Warning", r"(torch\.nn\.functional|diffusers\.|transformers\.)",
                 "shape checks frozen at the traced shapes, which the engines run (their outputs are compared with "
                 "eager); matched as TracerWarning's base, Warning, so `import sdperf` does not import torch."),
    KnownWarning(r"`is_gradient_checkpointing` is deprecated", "builtins:FutureWarning",
                 r"transformers\.modeling_utils", "torch.jit.trace reads every attribute of the CLIP text encoder, "
                 "this deprecated one too; unused."),
    KnownWarning(r"# The axis name: \w+ will not be used, since it shares the same shape constraints",
                 "builtins:UserWarning", r"torch\.onnx\._internal\.exporter\._onnx_program",
                 "the ONNX export gives latents and text embeddings one batch Dim on purpose (unet_graph)."),
)

LOG_RECORDS = (
    KnownLogRecord("torch.utils.cpp_extension", r"^No CUDA runtime is found, using CUDA_HOME=",
                   "torch's CUDA build says so whenever it sees no GPU; inductor's CPU kernels do not use CUDA_HOME."),
    KnownLogRecord("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile",
                   "torchao (imported by diffusers) registers its Enums as pytree constants: about torchao's code."),
    KnownLogRecord("diffusers.quantizers.torchao.torchao_quantizer", r"^Unable to import `torchao` Tensor objects",
                   "diffusers looks for tensor classes torchao moved, used only to load torchao checkpoints: none."),
    KnownLogRecord("transformers.modeling_utils", r"^`loss_type=None` was set in the config but it is unrecognized",
                   "tracing reads every attribute of the CLIP encoder, loss_function too; the study never calls it."),
)

# kineto prints trace markers (level 5) and, without a GPU, "gpuGetDeviceCount failed" (level 4) at every profile;
# level 6 silences both, set only without a GPU driver so that kineto's GPU errors still show.
KINETO_LEVEL_ENV, KINETO_QUIET = "KINETO_LOG_LEVEL", "6"
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


class DropKnown(logging.Filter):
    """Drops the records of one logger whose formatted message matches `pattern`; passes every other record."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


class GuardErrorOnOneLine(logging.Filter):
    """torch.compile's guard-creation failure (where it was allocated, the exception, the stack that made it) as one
    ERROR line instead of ~40; the exception, re-raised to the caller, carries everything that is dropped."""

    ALLOCATED, ERROR, CREATED = "Failing guard allocated at", "Error while creating guard", "Created at:"

    def __init__(self):
        super().__init__()
        self.allocated_at: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if record.name.endswith("symbolic_shapes") and msg.startswith(self.ALLOCATED):
            self.allocated_at = str(record.args[0]) if record.args else None
            return False
        if record.name != "torch._guards":
            return True
        if msg.startswith(self.CREATED):
            return False
        if msg.startswith(self.ERROR):
            exc = record.exc_info[1] if record.exc_info else None
            where = f"; failing guard allocated at {self.allocated_at}" if self.allocated_at else ""
            guard = str(record.args[0]).splitlines() if record.args else []
            kind = next((ln.split(":", 1)[1].strip() for ln in guard if "Create Function:" in ln), "?")
            record.msg = (f"torch.compile: Dynamo could not create guard {kind}{where}: "
                          f"{type(exc).__name__ if exc else 'error'}: {exc}; the call raises it to its caller")
            record.args, record.exc_info, record.exc_text, record.stack_info = (), None, None, None
            self.allocated_at = None
        return True


def _category(spec: str) -> type[Warning] | None:
    """'module:Class' -> the class; None when that library is not installed (nothing of it can warn then)."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def gpu_driver_present() -> bool:
    """A GPU driver's device file exists (NVIDIA or AMD), checked without importing torch."""
    return any(Path(p).exists() for p in GPU_DEVICE_FILES)


def filter_warnings() -> None:
    """Put a filter for each of WARNINGS in front of the current ones (warnings.filterwarnings)."""
    for known in WARNINGS:
        category = _category(known.category)
        if category is not None:
            warnings.filterwarnings("ignore", message=known.message, category=category, module=known.module)


def filter_log_records() -> None:
    """Drop each of LOG_RECORDS at its logger, and put torch's guard-creation failure on one line."""
    for known in LOG_RECORDS:
        logging.getLogger(known.logger).addFilter(DropKnown(known.message))
    one_line = GuardErrorOnOneLine()
    for name in ("torch._guards", "torch.fx.experimental.symbolic_shapes"):
        logging.getLogger(name).addFilter(one_line)


def quiet_profiler(gpu: bool | None = None) -> None:
    """KINETO_LOG_LEVEL=6 where no GPU driver is present (and the variable is not set already)."""
    if not (gpu_driver_present() if gpu is None else gpu):
        os.environ.setdefault(KINETO_LEVEL_ENV, KINETO_QUIET)


def warning_filters_in_force() -> bool:
    """Every filter of WARNINGS is among the current ones (a catch_warnings block may have dropped them)."""
    ignored = {f[1].pattern for f in warnings.filters if f[0] == "ignore" and f[1] is not None}
    return all(known.message in ignored for known in WARNINGS if _category(known.category) is not None)


_logs_quiet = False


def install() -> None:
    """Everything above; a second call adds only the warning filters that are no longer in force."""
    global _logs_quiet
    if not warning_filters_in_force():
        filter_warnings()
    if not _logs_quiet:
        filter_log_records()
        quiet_profiler()
        _logs_quiet = True


def loading_bars_off() -> None:
    """No 'Loading pipeline components' / 'Loading weights' bars when diffusers and transformers read a pipeline."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
