"""OpenVINO, Intel's inference engine, running the UNet on the CPU.

`openvino.convert_model` traces the UNet into an OpenVINO model; `compile_model` fuses it for the CPU. A bf16 hint
on a CPU without bf16 is silently ignored, so the precision used is read back and a mismatch is an error, never a
mislabelled row. Static shapes let the plugin plan every kernel ahead; a call with other shapes recompiles.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from sdperf.optimizations import artefacts
from sdperf.optimizations.unet_graph import INPUTS, EngineUNet, UNetGraph

PACKAGES = ("openvino",)

DEVICE = "CPU"
PRECISIONS = ("f32", "bf16", "f16", "default")  # "default": no hint, the plugin's own choice for this CPU
# the OPTIMIZATION_CAPABILITIES entry a CPU must list for the plugin to honour each reduced-precision hint
CAPABILITY = {"bf16": "BF16", "f16": "FP16"}
# The measured roof (sdperf.measure.roofline) of the plugin's GEMM in each precision: what an executor is held to
ROOFS = {"f32": "openvino MatMul f32", "int8": "openvino MatMul int8 (u8s8)", "bf16": "openvino MatMul bf16"}


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"OpenVINO precision {precision!r} is not valid; choose one of: {', '.join(PRECISIONS)}")


def capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))


def default_precision() -> str:
    """The CPU plugin's default INFERENCE_PRECISION_HINT on this machine ('f32', 'bf16', ...)."""
    import openvino as ov

    return ov.Core().get_property(DEVICE, "INFERENCE_PRECISION_HINT").get_type_name()


def availability(device: str, precision: str) -> tuple[bool, str]:
    """Whether this CPU runs `precision` natively; the reason names what OpenVINO reports."""
    check_precision(precision)
    try:
        import openvino as ov
    except ImportError:
        return False, "the openvino package is not installed"
    if device != "cpu":
        return False, f"this rung runs OpenVINO's CPU plugin; the pipeline here runs on {device}"
    caps = capabilities()
    need = CAPABILITY.get(precision)
    if need and need not in caps:
        return False, (f"this CPU has no native {precision} for OpenVINO (OPTIMIZATION_CAPABILITIES: "
                       f"{', '.join(caps)}); the hint would be ignored and f32 would run under a {precision} label")
    hint = default_precision() if precision == "default" else precision
    return True, f"openvino {ov.__version__}, CPU plugin, inference precision {hint}"


def convert(unet: torch.nn.Module, example: tuple):
    """openvino.convert_model on the UNet traced once, without the trace check's re-run (inputs keep their names,
    shapes stay dynamic; the tracer's expected warnings are filtered in sdperf.core.quiet)."""
    import openvino as ov

    with torch.no_grad():
        traced = torch.jit.trace(UNetGraph(unet).eval(), example, check_trace=False)
        return ov.convert_model(traced, example_input=example)


def compile_model(model, precision: str, shapes: dict | None = None, cache_dir=None):
    """(compiled model, precision used): compiled for the CPU with the precision hint (none for 'default') and
    torch's thread count, at static `shapes` if given. `cache_dir` is OpenVINO's compiled-model cache, which it
    loads unchecked: the folder is sealed after every compile and a blob not matching its seal is deleted first."""
    import warnings

    import openvino as ov

    from sdperf.store import verified

    check_precision(precision)
    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads()}
    kept: dict = {}
    if cache_dir is not None:
        loose, kept = verified.prune_folder(cache_dir) if Path(cache_dir).is_dir() else ([], {})
        if loose:
            warnings.warn(f"OpenVINO's compiled-model cache {str(cache_dir)!r}: {len(loose)} blob(s) not sealed by "
                          "sdperf or changed since were deleted, and are compiled again", stacklevel=2)
        config["CACHE_DIR"] = str(cache_dir)
    if precision != "default":
        config["INFERENCE_PRECISION_HINT"] = precision
    if shapes:
        model.reshape({name: ov.PartialShape(list(shape)) for name, shape in shapes.items()})
    compiled = ov.Core().compile_model(model, DEVICE, config)
    if cache_dir is not None and Path(cache_dir).is_dir():
        verified.seal_folder(cache_dir, known=kept)
    used = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    if precision != "default" and used != precision:
        raise RuntimeError(f"OpenVINO compiled with inference precision {used} although {precision} was asked; "
                           f"this CPU's OPTIMIZATION_CAPABILITIES: {', '.join(capabilities())}")
    return compiled, used


def ir_model(unet: torch.nn.Module, example, scratch_root=None, kind: str = "openvino-ir", transform=None,
             key: dict | None = None):
    """(OpenVINO model, facts, cache_dir): the UNet converted (and `transform`ed, e.g. by NNCF). With `scratch_root`
    the IR is kept in the artefact cache and `cache_dir` is the plugin's cache beside it. `example` may be a callable
    (called only on conversion); `key` says what determines the artefact besides the weights (default: shapes)."""
    import openvino as ov

    def make(folder=None) -> tuple[object, dict]:
        t0 = time.perf_counter()
        inputs = example() if callable(example) else example
        facts = {"exporter": "torch.jit.trace + openvino.convert_model"}
        if transform is not None and scratch_root is not None:
            # a transform starts from the run's plain IR: the UNet is converted once per run, not per engine
            model, plain, _ = ir_model(unet, inputs, scratch_root)
            facts["converted"] = plain["artefact"]
        else:
            model = convert(unet, inputs)
        if transform is not None:
            model, more = transform(model)
            facts.update(more)
        facts["export_s"] = time.perf_counter() - t0
        if folder is not None:
            ov.save_model(model, str(folder / "unet.xml"), compress_to_fp16=False)
        return model, facts

    if scratch_root is None:
        model, facts = make()
        return model, facts, None
    name = artefacts.cache_key(kind, unet, **(key or {"shapes": [tuple(x.shape) for x in example]}))
    folder, facts, hit = artefacts.cached(scratch_root, name, lambda d: make(d)[1])
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(folder / "unet.xml"))
    facts = dict(facts, artefact=artefacts.origin(facts, hit, "converted"))
    if hit:
        facts.update(export_s=0.0, read_s=time.perf_counter() - t0)
    return model, facts, Path(scratch_root) / artefacts.PLUGIN_CACHE


def build(unet: torch.nn.Module, example: tuple, *, precision: str = "f32", static: bool = False,
          scratch_root=None) -> EngineUNet:
    """Convert (or read the cached IR), compile (at the example's shapes when `static`), and wrap."""
    import openvino as ov

    check_precision(precision)
    model, facts, cache_dir = ir_model(unet, example, scratch_root)
    facts.update(dynamic_batch=not static, engine=f"openvino {ov.__version__}")
    shapes = dict(zip(INPUTS, (tuple(x.shape) for x in example)))
    t0 = time.perf_counter()
    compiled, used = compile_model(model, precision, shapes if static else None, cache_dir)
    facts.update(build_s=time.perf_counter() - t0, precision=used, requested_precision=precision,
                 static_shapes=static, threads=torch.get_num_threads())
    state = {"shapes": shapes, "request": compiled.create_infer_request()}

    def run(feeds: dict) -> torch.Tensor:
        now = {k: tuple(v.shape) for k, v in feeds.items()}
        if static and now != state["shapes"]:  # a new shape: recompile for it (the first call carries it)
            state.update(shapes=now, request=None)
            state["request"] = compile_model(model, precision, now, cache_dir)[0].create_infer_request()
        out = state["request"].infer({k: v.detach().cpu().numpy() for k, v in feeds.items()},
                                     share_inputs=True, share_outputs=False)
        return torch.from_numpy(out[0])

    # a converted model shares the torch UNet's weights, so both stay; one read from the cache owns its weights
    keep = (model,) if facts.get("artefact", "").startswith("loaded") else (unet, model)
    return EngineUNet(run, unet.config, device="cpu", facts=facts, keep=keep)
