"""torch.compile on the UNet.

Dynamo traces the UNet's Python into guarded FX graphs; a backend compiles each. Inductor fuses pointwise work into
generated kernels (Triton on a GPU, C++/OpenMP on a CPU); its modes add GEMM autotuning and CUDA graphs (GPU only).
`freezing` treats the weights as constants so they can be folded and pre-packed for oneDNN (inference only).
Compilation is lazy (first call, and again when a guard fails), so it is reported apart from steady state.
Regional compilation (diffusers' `compile_repeated_blocks`) compiles only the repeated transformer blocks.

A set-up is written as a spec string: a mode or backend, '+'-joined with flags, e.g. "default",
"max-autotune-no-cudagraphs+freezing", "regional", "channels_last" (eager), "channels_last+freezing", "openvino".
"""
from __future__ import annotations

import contextlib
import os
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.utils._triton import has_triton

from sdperf.optimizations.catalog import EXECUTOR, Technique

EAGER = "eager"
INDUCTOR = "inductor"
OPENVINO = "openvino"
MODES = tuple(torch._inductor.list_mode_options())
CUDA_GRAPH_MODES = tuple(m for m, opts in torch._inductor.list_mode_options().items() if opts.get("triton.cudagraphs"))


def _without_cuda_graphs(mode: str) -> str:
    """The mode whose options are `mode`'s minus CUDA graphs: what a CUDA-graph mode runs as without them."""
    options = torch._inductor.list_mode_options()
    rest = {k: v for k, v in options[mode].items() if k != "triton.cudagraphs"}
    return next(m for m, o in options.items() if o == rest)


CPU_COUNTERPART = {m: _without_cuda_graphs(m) for m in CUDA_GRAPH_MODES}
FLAGS = ("freezing", "fullgraph", "regional", "channels_last")
INDUCTOR_ONLY_FLAGS = ("freezing", "regional")
# How the recompile experiment sets Dynamo's shape handling.
DYNAMIC_SETTINGS = {"static": False, "automatic": None, "dynamic": True, "mark_dynamic": None}


@dataclass(frozen=True)
class CompileSpec:
    """One compile set-up; `backend` is "inductor", "openvino" or "eager" (not compiled)."""

    backend: str = INDUCTOR
    mode: str = "default"
    freezing: bool = False
    fullgraph: bool = False
    regional: bool = False
    channels_last: bool = False

    @property
    def compiled(self) -> bool:
        return self.backend != EAGER

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.backend == INDUCTOR and self.mode in CUDA_GRAPH_MODES

    def inductor_patches(self) -> dict:
        """Inductor config this set-up needs while Dynamo traces and inductor compiles."""
        return {"freezing": True} if self.freezing else {}


def _choices() -> str:
    return (f"a mode ({', '.join(MODES)}), a backend ({OPENVINO}) or {EAGER!r}, optionally '+'-joined with "
            f"flags ({', '.join(FLAGS)})")


def parse(spec: str) -> CompileSpec:
    """'max-autotune-no-cudagraphs+freezing' -> CompileSpec; an unknown word raises ValueError naming the choices."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"compile spec {spec!r} is empty; give {_choices()}")
    kinds, flags = [], set()
    for word in (w.strip() for w in spec.split("+")):
        if word in FLAGS:
            flags.add(word)
        elif word in MODES or word in (OPENVINO, EAGER):
            kinds.append(word)
        else:
            raise ValueError(f"{word!r} in compile spec {spec!r} is not a valid mode, backend or flag; valid "
                             f"modes: {', '.join(MODES)}; backends: {OPENVINO}, {EAGER}; flags: {', '.join(FLAGS)}")
    if len(kinds) > 1:
        raise ValueError(f"compile spec {spec!r} names {len(kinds)} modes/backends ({', '.join(kinds)}); give one")
    kind = kinds[0] if kinds else (EAGER if flags == {"channels_last"} else "default")
    backend = kind if kind in (OPENVINO, EAGER) else INDUCTOR
    if backend != INDUCTOR and flags & set(INDUCTOR_ONLY_FLAGS):
        raise ValueError(f"compile spec {spec!r}: {' and '.join(sorted(flags & set(INDUCTOR_ONLY_FLAGS)))} "
                         f"need the inductor backend, not {backend!r}")
    if backend == EAGER and "fullgraph" in flags:
        raise ValueError(f"compile spec {spec!r}: fullgraph needs a compiled backend, not {EAGER!r}")
    return CompileSpec(backend=backend, mode=kind if backend == INDUCTOR else "default",
                       **{f: f in flags for f in FLAGS})


def cpp_compiler() -> str | None:
    """The C++ compiler inductor's CPU kernels need (None when there is none)."""
    from torch._inductor import config

    names = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    return next((shutil.which(n) for n in names if n and shutil.which(n)), None)


def openvino_installed() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def availability(device: str, spec: str) -> tuple[bool, str]:
    """Can `spec` run on `device`, and what of it applies there. Bad spec -> ValueError listing the choices."""
    s = parse(spec)
    if not s.compiled:
        return True, "eager PyTorch" + (" with channels_last tensors" if s.channels_last else "")
    if s.backend == OPENVINO:
        if device != "cpu":
            return False, "the OpenVINO backend runs on Intel CPUs/GPUs/NPUs, not on CUDA tensors"
        if not openvino_installed():
            return False, "openvino is not installed (pip install openvino; needs `import openvino.torch`)"
        return True, "OpenVINO compiles the Dynamo graphs for its CPU plugin"
    if device == "cpu" and cpp_compiler() is None:
        return False, "inductor's CPU kernels need a C++ compiler (g++/clang++), and none is on PATH"
    if device == "cuda" and not has_triton():
        return False, "inductor's GPU kernels need Triton, and it is not installed for this GPU"
    if s.uses_cuda_graphs and device != "cuda":
        return False, (f"CUDA graphs need a CUDA device. torch.compile accepts mode {s.mode!r} on {device} anyway: "
                       f"it compiles the kernels of {CPU_COUNTERPART[s.mode]!r} and skips the graph capture "
                       "silently (no warning, only counters['inductor']['cudagraph_skips']), so "
                       f"{CPU_COUNTERPART[s.mode]!r} is its {device} counterpart")
    notes = []
    if s.regional:
        notes.append("diffusers' compile_repeated_blocks: only the UNet's transformer blocks are compiled (one graph "
                     "serves every block of the same shape), the rest stays eager")
    if s.freezing:
        notes.append("freezing treats weights as constants: inference only, weights must not change afterwards")
    if s.channels_last:
        notes.append("UNet weights in channels_last layout")
    if s.uses_cuda_graphs:
        notes.append("CUDA graphs replay each step's kernels in one launch")
    if s.mode.startswith("max-autotune") and device == "cpu":
        notes.append("on cpu, GEMM autotuning (C++ templates) only considers weights that freezing made constant"
                     + ("" if s.freezing else ", so without freezing it autotunes nothing"))
    return True, "; ".join(notes) or f"inductor, mode {s.mode}"


def import_openvino_backend() -> None:
    """Register backend="openvino"."""
    import openvino.torch  # noqa: F401


def compile_kwargs(s: CompileSpec, dynamic: bool | None = None) -> dict:
    """The torch.compile arguments of a spec (the inductor config patches are applied around each call)."""
    kw = {"backend": s.backend, "fullgraph": s.fullgraph, "dynamic": dynamic}
    if s.backend == INDUCTOR:
        kw["mode"] = s.mode
    return kw


@dataclass
class CompileLog:
    """What compiling did: the compile records (get_compilation_metrics) and how often inductor skipped CUDA graphs
    (silently, on a CPU-only graph)."""

    records: list = field(default_factory=list)
    cudagraph_skips: int = 0


@contextlib.contextmanager
def compile_log(log: CompileLog | None = None):
    """Adds to `log` what compiling did inside the block."""
    log = CompileLog() if log is None else log
    seen = {id(m) for m in get_compilation_metrics()}
    skips = counters["inductor"]["cudagraph_skips"]
    try:
        yield log
    finally:
        log.records += [m for m in get_compilation_metrics() if id(m) not in seen]
        log.cudagraph_skips += counters["inductor"]["cudagraph_skips"] - skips


class CompileError(RuntimeError):
    """torch.compile failed before the compiled UNet ran; the original exception is chained (`__cause__`)."""


# Files of the step where Dynamo builds the guards of a traced frame: a failure there is torch's, not the model's.
GUARD_FILES = ("torch/_guards.py", "torch/_dynamo/guards.py")


def guard_failure(exc: BaseException, backend: str) -> CompileError | None:
    """A CompileError naming the frame that raised, when `exc` was raised while Dynamo built its guards; else None."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not any(f.filename.replace(os.sep, "/").endswith(GUARD_FILES) for f in frames):
        return None
    last = frames[-1]
    where = f"{last.name} ({'/'.join(Path(last.filename).parts[-2:])}:{last.lineno})"
    return CompileError(f"torch.compile (backend {backend}) failed while Dynamo built the traced UNet's guards, "
                        f"in {where}: {type(exc).__name__}: {exc}")


class CompiledUNet(torch.nn.Module):
    """The compiled UNet as the generation loop calls it, with .dtype, .device and .config. Each call runs under the
    spec's inductor config patches: compilation is lazy, so a config set only around torch.compile() would be gone
    when it happens. `log` keeps what compiling did during its calls."""

    def __init__(self, unet: torch.nn.Module, compiled, spec: CompileSpec):
        super().__init__()
        self.original = unet
        self.compiled = compiled
        self.spec = spec
        self.log = CompileLog()

    @property
    def dtype(self) -> torch.dtype:
        return next(self.original.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.original.parameters()).device

    @property
    def config(self):
        return self.original.config

    def forward(self, *args, **kwargs):
        patches = self.spec.inductor_patches()
        graphs = self.spec.uses_cuda_graphs and self.device.type == "cuda"
        scope = torch._inductor.config.patch(patches) if patches else contextlib.nullcontext()
        with compile_log(self.log), scope:
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()  # a new step: earlier outputs may be overwritten
            try:
                out = self.compiled(*args, **kwargs)
            except Exception as exc:
                failure = guard_failure(exc, self.spec.backend)
                if failure is None:
                    raise
                raise failure from exc
        if graphs:
            # the loop keeps outputs across steps (PLMS history); a replay overwrites the graph's output buffer
            out = tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in out)
        return out


def apply(pipe, spec: str, dynamic: bool | None = None):
    """Compile `pipe.unet` as `spec` says (lazily: the work happens on the first call); returns the pipeline."""
    s = parse(spec)
    unet = pipe.unet
    if s.channels_last:
        unet.to(memory_format=torch.channels_last)
    if not s.compiled:
        return pipe
    if s.backend == OPENVINO:
        import_openvino_backend()
    kw = compile_kwargs(s, dynamic)
    if s.regional:  # diffusers' regional compilation: every repeated block (the UNet's transformer blocks)
        unet.compile_repeated_blocks(**kw)
        compiled = unet
    else:
        compiled = torch.compile(unet, **kw)
    pipe.unet = CompiledUNet(unet, compiled, s)
    return pipe


def compile_facts(log: CompileLog) -> dict:
    """What compiling cost and produced, from a CompileLog (CompiledUNet.log or compile_log())."""
    records = log.records
    ok = [r for r in records if not r.fail_type]
    return {
        "graphs_compiled": sum(1 for r in ok if r.graph_op_count),
        "compile_s": sum(r.entire_frame_compile_time_s or 0.0 for r in records),
        "fx_graph_cache_hits": sum(r.inductor_fx_local_cache_hit_count or 0 for r in records),
        "fx_graph_cache_misses": sum(r.inductor_fx_local_cache_miss_count or 0 for r in records),
        "graph_breaks": max((r.num_graph_breaks or 0 for r in records), default=0),
        "cudagraph_skips": log.cudagraph_skips,
        "recompile_reasons": [r.recompile_reason for r in records if r.recompile_reason],
        "failures": [f"{r.fail_type}: {r.fail_reason}" for r in records if r.fail_type],
    }


NOTEBOOK = "04_torch_compile"
TRANSFER = ("transfers", "a compiled graph that keeps fp32 arithmetic changes rounding order only, on any model")
KEY_PREFIXES = ("compile",)
PACKAGES = ("openvino",)  # what a compile key may import: the openvino backend
CANONICAL = ("default", "freezing", "reduce-overhead", "max-autotune-no-cudagraphs", "regional", "channels_last",
             "channels_last+freezing", "openvino")


CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
CACHE_FOLDER = "inductor"  # under a profile's scratch folder, one sub-folder per run (inductor_dir)


def inductor_dir(scratch: Path) -> Path:
    """This run's inductor cache, shared by its workers and never by another run (inductor executes the Python
    wrappers it caches, so a cache that outlived its run would run whatever was appended to it since)."""
    from sdperf.core import environment

    return Path(scratch) / CACHE_FOLDER / environment.run_id()


def clear_inductor(scratch: Path) -> None:
    """Every run's inductor cache under `scratch` gone (the next compile is cold), never through a link."""
    from sdperf.core.paths import remove_owned, removable

    folder = Path(scratch) / CACHE_FOLDER
    if (folder.exists() or folder.is_symlink()) and removable(folder.parent):
        remove_owned(folder)


def _compiled(spec: str):
    def run(pipe, ctx):
        if ctx.scratch is not None:
            # set here: inductor reads it at compile time (freezing's mkldnn graph is never cached, only kernels)
            os.environ[CACHE_ENV] = str(inductor_dir(ctx.scratch))
            ctx.facts["inductor_cache"] = os.environ[CACHE_ENV]
        pipe = apply(pipe, spec)
        log = getattr(pipe.unet, "log", None)
        ctx.facts["compile_log"] = log  # read after the first call (compilation is lazy)
        return pipe
    return run


def technique(prefix: str, spec: str) -> Technique:
    """compile:<spec>: torch.compile of the UNet as torch_compile.parse reads the spec."""
    s = parse(spec)
    return Technique(f"{prefix}:{spec}", f"torch.compile {spec}" if s.compiled else spec, EXECUTOR, NOTEBOOK, transfer=TRANSFER,
                     apply=_compiled(spec), availability=lambda ctx: availability(ctx.device, spec),
                     loop_only=True, extra_copies={"unet": 1} if s.freezing else {},  # frozen constants
                     packages=PACKAGES if s.backend == "openvino" else (),
                     note="compiled lazily: the compile lands in the first call, reported apart")


def techniques() -> list[Technique]:
    return [technique("compile", s) for s in CANONICAL]
