"""Known, harmless warnings and log lines of the pinned libraries, filtered once for the whole study.

`import sdperf` calls install(), so every notebook, worker process and CLI command has these filters before the
libraries that warn are imported. Each filter names the exact message, with its category and the module (or the
logger) that issues it, and says why it tells a reader nothing about the study. Anything else, of the same
category or from the same module, still shows: a new warning is news.

Output that is not a Python warning or a log record cannot be filtered by message: the profiler's C++ log lines
(kineto) are quietened by their own level setting, only where no GPU is present.
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
    """One warnings.warn call of a pinned library: its message (a regex matched from the start), its category
    ('module:Class' for a library's own class, resolved when installed), the module it is attributed to (a regex
    on the warning's module, as warnings.filterwarnings matches it), and why it is harmless here."""

    message: str
    category: str
    module: str
    why: str


@dataclass(frozen=True)
class KnownLogRecord:
    """One logger.warning call of a pinned library: the logger's name, a regex searched in the formatted message,
    and why it is harmless here."""

    logger: str
    message: str
    why: str


WARNINGS = (
    KnownWarning(r"IProgress not found\. Please update jupyter and ipywidgets", "tqdm:TqdmWarning", r"",
                 "tqdm.auto (imported by diffusers and huggingface_hub) looks for ipywidgets inside a Jupyter "
                 "kernel; papermill runs the notebooks headless and the study draws no progress bars, so the text "
                 "fallback it announces is never seen. Issued at import, attributed to whichever module imported "
                 "tqdm.auto first, so matched by category and message only."),
    KnownWarning(r'install "ipywidgets" for Jupyter support', "builtins:UserWarning", r"rich\.live",
                 "NNCF draws its quantization progress with rich, which asks for ipywidgets inside a kernel; the "
                 "bar is discarded anyway (optimizations.stage_engines, quantization)."),
    KnownWarning(r"torch\._dynamo\.config\.inline_inbuilt_nn_modules is deprecated", "builtins:FutureWarning",
                 r"openvino\.", "importing openvino.torch (the compile:openvino backend) sets a Dynamo flag that "
                 "torch 2.14 ignores: it always inlines nn.Modules, which is what the flag asked for."),
    KnownWarning(r"`torch\.jit\.trace(_method)?` is deprecated", "builtins:FutureWarning", r"torch\.jit\._trace",
                 "the ONNX (torchscript exporter) and OpenVINO engines are made from a deliberate torch.jit.trace: "
                 "the pinned openvino.convert_model still takes a traced module, and TorchScript's deprecation "
                 "says nothing about the traced graph."),
    KnownWarning(r"Converting a tensor to a Python boolean might cause the trace to be incorrect",
                 "builtins:Warning", r"(torch\.nn\.functional|diffusers\.|transformers\.)",
                 "torch.jit.trace of the UNet, text encoder and VAE decoder for the engines: these are the shape "
                 "checks of torch.nn.functional, diffusers and transformers (channel counts, upsampling sizes, "
                 "mask shapes) frozen at the traced shapes, which are the shapes the engines run (or the batch "
                 "axis alone, left dynamic); every engine's output is compared with eager (drift rows, tests). "
                 "Any other TracerWarning (a Python int or a constant tensor frozen, a trace mismatch) still shows. "
                 "Its category, torch.jit.TracerWarning, is matched as Warning (its base) so that `import sdperf` "
                 "does not import torch; the message is the tracer's own."),
    KnownWarning(r"`is_gradient_checkpointing` is deprecated", "builtins:FutureWarning",
                 r"transformers\.modeling_utils",
                 "torch.jit.trace reads every attribute of the CLIP text encoder it traces, including this "
                 "deprecated property of transformers' PreTrainedModel; the study never uses it."),
    KnownWarning(r"# The axis name: \w+ will not be used, since it shares the same shape constraints",
                 "builtins:UserWarning", r"torch\.onnx\._internal\.exporter\._onnx_program",
                 "the dynamo ONNX export gives the latents and the text embeddings one shared batch Dim on purpose "
                 "(optimizations.unet_graph); torch.onnx reports keeping one name for it."),
)

LOG_RECORDS = (
    KnownLogRecord("torch.utils.cpp_extension", r"^No CUDA runtime is found, using CUDA_HOME=",
                   "torch's CUDA build says so whenever torch sees no GPU (the environment record says the same: "
                   "gpu 'not applicable'); inductor's CPU kernels, the only ones built here, do not use CUDA_HOME."),
    KnownLogRecord("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile",
                   "diffusers imports torchao whenever it is installed, and torchao 0.18 registers its Enums as "
                   "pytree constants, which torch 2.14 deprecates: one line per Enum, about torchao's code."),
    KnownLogRecord("diffusers.quantizers.torchao.torchao_quantizer",
                   r"^Unable to import `torchao` Tensor objects",
                   "diffusers looks for tensor classes that torchao 0.18 moved; they matter only for loading "
                   "checkpoints serialized with torchao, and the study loads none (its int8 models are made in "
                   "the worker that times them)."),
    KnownLogRecord("transformers.modeling_utils", r"^`loss_type=None` was set in the config but it is unrecognized",
                   "torch.jit.trace reads every attribute of the CLIP text encoder it traces for the stage engines, "
                   "including PreTrainedModel.loss_function, which looks up a training loss; the study trains no "
                   "CLIP model and never calls it."),
)

# kineto (torch.profiler's C++ side) prints its trace markers (USDT lines, level 5) and, on a machine without a
# GPU, "gpuGetDeviceCount failed" (ERROR, level 4) on stderr at every profile. Level 6 silences both; it is set only
# where no GPU driver is present, so on a GPU machine kineto's errors (CUPTI missing, no GPU activity) still show.
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
    """torch.compile's guard-creation failure as one line instead of ~40.

    When Dynamo cannot build a guard (torch 2.14 with the OpenVINO backend on the UNet: an IndexError in
    symbolic_shapes.issue_guard), torch logs where the guard was allocated (torch.fx.experimental.symbolic_shapes,
    WARNING), the exception with its traceback and the guard's fields ("Error while creating guard", torch._guards,
    ERROR) and the stack that created it ("Created at", ERROR), then re-raises. The exception reaches the caller,
    which records it (a worker stores its traceback in the result and the error in the row's note:
    optimizations.torch_compile.CompileError), so the log keeps one ERROR line that says what happened and where,
    and drops the rest. Nothing is dropped that the raised exception does not carry."""

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
    """Every filter of WARNINGS is among the current ones (a warnings.catch_warnings block that was open when
    they were added restores the list it saved when it closes)."""
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
    """No 'Loading pipeline components' / 'Loading weights' bars on stderr when diffusers and transformers read
    a saved pipeline: one bar per component per load, hundreds of lines in a notebook that loads the reference
    model per technique, and nothing a reader needs (the load time, where it matters, is measured)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
