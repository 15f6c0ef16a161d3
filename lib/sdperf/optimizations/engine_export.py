"""Exported inference engines in place of the PyTorch UNet: TensorRT fp16 on NVIDIA GPUs, ONNX Runtime and OpenVINO
on CPUs. An engine trades a set-up cost (export, build) for faster calls (fusion, pre-packed weights, memory planned
once). Only the UNet is exported. An engine is named `<engine>-<precision>[-static]`, e.g. `openvino-f32-static`.
"""
from __future__ import annotations

from dataclasses import dataclass

from sdperf.optimizations import onnx_runtime, openvino_engine, tensorrt_engine
from sdperf.optimizations.unet_graph import EXPORTERS, example_inputs, float32_unet
from sdperf.optimizations import half_precision
from sdperf.optimizations.catalog import EXECUTOR, Technique

ENGINES = {"onnxruntime": onnx_runtime, "openvino": openvino_engine, "tensorrt": tensorrt_engine}
TITLES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO", "tensorrt": "TensorRT"}
PACKAGES = tuple(dict.fromkeys(p for m in ENGINES.values() for p in m.PACKAGES))  # any engine key
STATIC_ENGINES = ("openvino",)  # ORT runs its dynamic-batch graph; TensorRT's profile fixes the shape range


@dataclass(frozen=True)
class EngineSpec:
    engine: str
    precision: str
    static: bool = False

    @property
    def name(self) -> str:
        return f"{self.engine}-{self.precision}" + ("-static" if self.static else "")

    @property
    def label(self) -> str:
        return f"{TITLES[self.engine]} {self.precision}" + (", static shapes" if self.static else "")


def valid_names() -> list[str]:
    names = [f"{e}-{p}" for e, mod in ENGINES.items() for p in mod.PRECISIONS]
    return names + [f"{n}-static" for n in names if n.split("-")[0] in STATIC_ENGINES]


def parse(name: str) -> EngineSpec:
    """'openvino-f32-static' -> EngineSpec('openvino', 'f32', static=True); anything else is a ValueError."""
    if name not in valid_names():
        raise ValueError(f"engine {name!r} is not valid; choose one of: {', '.join(valid_names())}")
    engine, precision, *rest = name.split("-")
    return EngineSpec(engine, precision, static=bool(rest))


def availability(device: str, name: str) -> tuple[bool, str]:
    """Whether the engine can run on `device` here, and if not, exactly why."""
    spec = parse(name)
    if spec.engine == "openvino":
        return openvino_engine.availability(device, spec.precision)
    return ENGINES[spec.engine].availability(device)


def build(unet, name: str, *, batch: int, latent_size: int, exporter: str = "dynamo", scratch_root=None,
          batch_range: tuple[int, int] | None = None):
    """The engine for `unet` at UNet batch `batch` (twice the images with guidance) and latent size.
    `batch_range` (min, max) is the UNet batch range a TensorRT profile must cover."""
    spec = parse(name)
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter {exporter!r} is not valid; choose one of: {', '.join(EXPORTERS)}")
    device = "cuda" if spec.engine == "tensorrt" else "cpu"
    example = example_inputs(unet.config, batch, latent_size, device=device)
    if spec.engine == "onnxruntime":
        engine = onnx_runtime.build(unet, example, exporter=exporter, scratch_root=scratch_root)
    elif spec.engine == "openvino":
        engine = openvino_engine.build(unet, example, precision=spec.precision, static=spec.static,
                                       scratch_root=scratch_root)
    else:
        lo, hi = batch_range or (batch, batch)
        engine = tensorrt_engine.build(unet, example, batches=(lo, batch, hi), exporter=exporter,
                                       scratch_root=scratch_root)
    engine.facts["name"] = spec.name
    return engine


def apply(pipe, name: str, *, batch: int, latent_size: int, **kw):
    """Replace `pipe.unet` by the engine; the PyTorch UNet is freed unless the engine needs its weights."""
    pipe.unet = build(float32_unet(pipe.unet), name, batch=batch, latent_size=latent_size, **kw)
    return pipe


NOTEBOOK = "07_engine_export"
TRANSFER = ("transfers", "an engine that keeps fp32 arithmetic changes rounding order only, on any model")
KEY_PREFIXES = ("engine",)
LOSSLESS = ("fp32", "f32")  # precisions that keep fp32 arithmetic (the engine may still reorder it)


def unet_batch(profile, batch_size: int) -> int:
    """Images per prompt -> UNet batch: classifier-free guidance runs the uncond and cond halves together."""
    return batch_size * (2 if profile.guidance_scale > 1.0 else 1)


def _built(name: str, exporter: str = "dynamo"):
    def run(pipe, ctx):
        from sdperf.measure.timing import peak_memory, reset_peak_memory

        p = ctx.profile
        reset_peak_memory(p.device)
        pipe = apply(pipe, name, batch=unet_batch(p, ctx.batch_size), latent_size=p.latent_size, exporter=exporter,
                     scratch_root=ctx.artefacts, batch_range=(unet_batch(p, min(p.batch_sizes)),
                                                            unet_batch(p, max(p.batch_sizes))))
        ctx.facts.update(pipe.unet.facts)
        ctx.facts["setup_peak_mib"] = peak_memory(p.device)[0] / 2**20
        return pipe
    return run


def technique(prefix: str, name: str) -> Technique:
    """engine:<engine>-<precision>[-static]: the UNet exported to that engine (the text encoder and VAE stay)."""
    spec = parse(name)
    return Technique(f"{prefix}:{name}", spec.label, EXECUTOR, NOTEBOOK, apply=_built(name),
                     transfer=TRANSFER if spec.precision in LOSSLESS else half_precision.TRANSFER, loop_only=True,
                     availability=lambda ctx: availability(ctx.device, name), traces_unet=True,
                     extra_copies={"unet": 2},  # the exported graph and the engine built from it
                     packages=ENGINES[spec.engine].PACKAGES,
                     roof_kernel=openvino_engine.ROOFS.get(spec.precision) if spec.engine == "openvino" else None,
                     changes_output=spec.precision not in LOSSLESS,
                     dtype={"fp16": "float16", "f16": "float16", "bf16": "bfloat16"}.get(spec.precision, "float32"),
                     note="the UNet only; exported from the fp32 pipeline, the engine applies its own precision")


def techniques() -> list[Technique]:
    return [technique("engine", n) for n in valid_names()]
