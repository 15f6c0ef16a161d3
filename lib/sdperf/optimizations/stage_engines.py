"""The two stages around the denoising loop, the CLIP text encoder and the VAE decoder, run by OpenVINO.

The UNet techniques cannot touch these stages, which weigh more the faster the loop gets; optimum-intel runs the
whole pipeline in OpenVINO. These keys stack with any UNet executor and change nothing in the loop:

- `stages:openvino-f32`: both stages as OpenVINO IR compiled in f32 at static shapes: the text encoder at
  (1, tokenizer.model_max_length) int64 ids (encode_prompt runs it at batch 1), the VAE decoder at the latents of
  the workload's image batch (classifier-free guidance doubles the UNet's batch, not the decoder's).
- `stages:openvino-int8w`: the same after NNCF `compress_weights` (int8 per-channel weights, fp32 compute).

Replaced: `pipe.text_encoder` and, inside `pipe.vae`, `post_quant_conv` and `decoder` (folded into one graph as
optimum-intel's vae_decoder does; post_quant_conv becomes an identity). The IR is kept in the artefact cache.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import logging
import time
from pathlib import Path

import numpy as np
import torch

from sdperf.optimizations import artefacts
from sdperf.optimizations.catalog import STAGES, Technique

NOTEBOOK = "07_engine_export"
TRANSFER = ("may not transfer",
            "an engine for the text encoder and VAE decoder: with int8 weights its error depends on those "
            "networks' ranges")
PRECISION = "f32"  # both keys compute in f32: only int8w's weights are reduced
VARIANTS = {
    "openvino-f32": "text encoder and VAE decoder (with post_quant_conv) as OpenVINO IR, compiled for the CPU in "
                    "f32 at static shapes",
    "openvino-int8w": "the same after nncf.compress_weights: int8 weights, f32 compute",
}
LABELS = {"openvino-f32": "OpenVINO f32 text encoder + VAE decoder",
          "openvino-int8w": "OpenVINO + NNCF int8-weight text encoder + VAE decoder"}
VARIANT_PACKAGES = {"openvino-f32": ("openvino",), "openvino-int8w": ("openvino", "nncf")}
EXPORTER = "torch.jit.trace + openvino.convert_model"
REPLACED = "pipe.text_encoder; pipe.vae.post_quant_conv + pipe.vae.decoder"


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"stage engine {variant!r} is not valid; choose one of: {', '.join(VARIANTS)}")


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _family(profile) -> str | None:
    """The architecture family of a random-weights profile ('sd', 'sdxl'); None for real weights (read at apply)."""
    if getattr(profile, "weights", None):
        return None
    from sdperf.config import architectures

    return architectures.get(profile.arch).family


def availability(profile, variant: str) -> tuple[bool, str]:
    """Runnable on a CPU with the variant's packages, for SD 1.x/2 (not SDXL, which reads hidden states)."""
    check_variant(variant)
    if profile.device != "cpu":
        return False, f"OpenVINO runs on CPUs (and Intel GPUs); this profile's device is {profile.device}"
    for module in VARIANT_PACKAGES[variant]:
        if not installed(module):
            return False, f"{module} is not installed"
    if _family(profile) == "sdxl":
        return False, ("SDXL's pipeline reads its text encoders' hidden states (and has two); these stand-ins "
                       "cover SD 1.x/2, whose pipeline reads the last hidden state")
    weights = "int8 weights (nncf.compress_weights)" if variant == "openvino-int8w" else "fp32 weights"
    return True, (f"openvino {importlib.metadata.version('openvino')}, CPU plugin, inference precision "
                  f"{PRECISION}, {weights}")


# -- the graphs an exporter traces ------------------------------------------------------------------------------

class TextEncoderGraph(torch.nn.Module):
    """CLIPTextModel as a function of its token ids: (last_hidden_state, pooler_output)."""

    def __init__(self, text_encoder: torch.nn.Module):
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids):
        out = self.text_encoder(input_ids, return_dict=False)
        return out[0], out[1]


class DecoderGraph(torch.nn.Module):
    """What AutoencoderKL._decode runs on scaled latents: post_quant_conv (when the VAE has one), then decoder."""

    def __init__(self, post_quant_conv: torch.nn.Module | None, decoder: torch.nn.Module):
        super().__init__()
        self.post_quant_conv = post_quant_conv if post_quant_conv is not None else torch.nn.Identity()
        self.decoder = decoder

    def forward(self, latents):
        return self.decoder(self.post_quant_conv(latents))


def float32_copy(module: torch.nn.Module) -> torch.nn.Module:
    """The module an exporter traces: float32 (a half-precision stage is copied up; the engine computes in f32)."""
    p = next(module.parameters(), None)
    if p is None or p.dtype == torch.float32:
        return module
    import copy

    return copy.deepcopy(module).float()


def convert(graph: torch.nn.Module, example: torch.Tensor):
    """openvino.convert_model on the graph traced once, unchecked (the tracer's warnings: sdperf.core.quiet)."""
    import openvino as ov

    with torch.inference_mode(False), torch.no_grad():
        traced = torch.jit.trace(graph.eval(), (example,), check_trace=False)
        return ov.convert_model(traced, example_input=(example,))


def int8_weight_count(model) -> int:
    """Weight tensors stored as int8/uint8 in an OpenVINO model (zero points, one value per channel, excluded)."""
    n = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant" or op.get_output_element_type(0).get_type_name() not in ("u8", "i8"):
            continue
        shape = list(op.get_output_shape(0))
        n += bool(shape) and int(np.prod(shape)) > shape[0]
    return n


def compress(model) -> tuple[object, dict]:
    """nncf.compress_weights with its defaults (int8 asymmetric, per output channel), quietly."""
    import nncf

    nncf.set_log_level(logging.WARNING)
    # NNCF's progress bar on stdout is kept out of a worker's log
    with contextlib.redirect_stdout(io.StringIO()):
        model = nncf.compress_weights(model)
    return model, {"nncf": nncf.__version__, "nncf_step": "compress_weights (int8_asym, per channel)",
                   "int8_weights": int8_weight_count(model)}


def ir_model(graph: torch.nn.Module, example: torch.Tensor, stage: str, scratch_root=None, int8w: bool = False):
    """(OpenVINO model, facts, read from disk): the stage's graph converted (weights compressed when `int8w`). With
    `scratch_root` the IR is cached; the int8 IR is made from the cached plain one, so each stage is traced once."""
    import openvino as ov

    def make(folder: Path | None = None) -> tuple[object, dict]:
        t0 = time.perf_counter()
        facts: dict = {"exporter": EXPORTER}
        if int8w and scratch_root is not None:
            model, plain, _ = ir_model(graph, example, stage, scratch_root)
            facts["converted"] = plain["artefact"]
        else:
            model = convert(graph, example)
        if int8w:
            model, more = compress(model)
            facts.update(more)
        facts["export_s"] = time.perf_counter() - t0
        if folder is not None:
            ov.save_model(model, str(folder / f"{stage}.xml"), compress_to_fp16=False)
        return model, facts

    if scratch_root is None:
        model, facts = make()
        return model, facts, False
    kind = f"openvino-{stage.replace('_', '-')}" + ("-int8w" if int8w else "")
    name = artefacts.cache_key(kind, graph, shape=tuple(example.shape), dtype=str(example.dtype))
    folder, facts, hit = artefacts.cached(scratch_root, name, lambda d: make(d)[1])
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(folder / f"{stage}.xml"))
    facts = dict(facts, artefact=artefacts.origin(facts, hit, "converted"))
    if hit:
        facts.update(export_s=0.0, read_s=time.perf_counter() - t0)
    return model, facts, True


# -- the compiled stages and the stand-ins the pipeline holds ---------------------------------------------------

class StaticEngine:
    """An OpenVINO model compiled in f32 at one static input shape; another shape recompiles (`recompiles`)."""

    def __init__(self, model, shape: tuple, cache_dir=None, keep: tuple = ()):
        self.model, self.cache_dir, self._keep = model, cache_dir, keep
        self.input = model.inputs[0].get_any_name()
        self.recompiles = 0
        t0 = time.perf_counter()
        self._compile(tuple(shape))
        self.build_s = time.perf_counter() - t0

    def _compile(self, shape: tuple) -> None:
        from sdperf.optimizations import openvino_engine

        compiled, self.precision = openvino_engine.compile_model(self.model, PRECISION, {self.input: shape},
                                                                 self.cache_dir)
        self.shape, self.request = shape, compiled.create_infer_request()

    def __call__(self, x: np.ndarray) -> list[torch.Tensor]:
        if tuple(x.shape) != self.shape:
            self._compile(tuple(x.shape))
            self.recompiles += 1
        out = self.request.infer({0: np.ascontiguousarray(x)}, share_inputs=True, share_outputs=False)
        return [torch.from_numpy(np.asarray(v)) for v in out.to_tuple()]


class EngineTextEncoder(torch.nn.Module):
    """Stands in for `pipe.text_encoder`: token ids in, (last hidden state, pooled output) out in the replaced
    encoder's dtype, with its `.dtype`, `.device` and `.config`."""

    def __init__(self, engine: StaticEngine, config, dtype: torch.dtype, facts: dict):
        super().__init__()
        self.engine, self.config, self.facts = engine, config, facts
        # an empty buffer carries the dtype, so that a later pipe.to(dtype) (precision:*) moves it like a module's
        self.register_buffer("_dtype_probe", torch.empty(0, dtype=dtype), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype_probe.dtype

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, input_ids, attention_mask=None, output_hidden_states=None, return_dict=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        asked = [n for n, v in (("attention_mask", attention_mask), ("output_hidden_states", output_hidden_states),
                                *kwargs.items()) if v is not None and v is not False]
        if asked:
            raise ValueError(f"the OpenVINO text encoder takes token ids only and returns the last hidden state and "
                             f"the pooled output; got {', '.join(asked)} (clip_skip and SDXL need hidden states)")
        hidden, pooled = self.engine(input_ids.to(torch.int64).cpu().numpy())
        out = BaseModelOutputWithPooling(last_hidden_state=hidden.to(self.dtype), pooler_output=pooled.to(self.dtype))
        return out if return_dict is not False else out.to_tuple()

    def extra_repr(self) -> str:
        return f"openvino, static input {self.engine.shape}, {self.facts.get('weights', '')}"


class EngineVAEDecoder(torch.nn.Module):
    """Stands in for `pipe.vae.decoder` with post_quant_conv folded in: latents in, images out in their dtype."""

    def __init__(self, engine: StaticEngine, facts: dict):
        super().__init__()
        self.engine, self.facts = engine, facts

    def forward(self, z, latent_embeds=None):
        if latent_embeds is not None:
            raise ValueError("the OpenVINO VAE decoder takes latents only; got latent_embeds (a spatially "
                             "conditioned decoder, not SD 1.x/2's)")
        return self.engine(z.detach().float().cpu().numpy())[0].to(z.dtype)

    def extra_repr(self) -> str:
        return f"openvino, static input {self.engine.shape}, {self.facts.get('weights', '')}"


def _stage(graph, example, stage: str, scratch_root, int8w: bool) -> tuple[StaticEngine, dict]:
    """Convert (or read) and compile one stage; a model converted here shares the torch weights, so it keeps them."""
    model, facts, from_disk = ir_model(graph, example, stage, scratch_root, int8w)
    cache_dir = Path(scratch_root) / artefacts.PLUGIN_CACHE if scratch_root is not None else None
    engine = StaticEngine(model, tuple(example.shape), cache_dir, keep=(model,) if from_disk else (graph, model))
    facts.update(build_s=engine.build_s, precision=engine.precision, shape=list(engine.shape),
                 weights="int8 weights (nncf.compress_weights), f32 compute" if int8w else "fp32 weights")
    return engine, facts


def token_ids(pipe) -> torch.Tensor:
    """Ids of the shape encode_prompt gives the encoder: one prompt padded to the tokenizer's maximum length."""
    tok = pipe.tokenizer
    return tok("", padding="max_length", max_length=tok.model_max_length, truncation=True,
               return_tensors="pt").input_ids.to(torch.int64)


def latent_shape(pipe, workload) -> tuple[int, int, int, int]:
    """The latents generation.decode hands the VAE: the workload's images (not the guidance batch)."""
    f = pipe.vae_scale_factor
    return (workload.batch_size, pipe.vae.config.latent_channels, workload.height // f, workload.width // f)


def apply(pipe, variant: str, workload, scratch_root=None) -> tuple[object, dict]:
    """Replace the text encoder and the VAE's post_quant_conv + decoder by OpenVINO stand-ins; (pipe, facts)."""
    import openvino as ov

    from sdperf.model.pipelines import is_sdxl

    check_variant(variant)
    if is_sdxl(pipe):
        raise ValueError("stage engines cover SD 1.x/2 pipelines; this one is SDXL (two text encoders read for their "
                         "hidden states)")
    int8w = variant == "openvino-int8w"
    text, vae = pipe.text_encoder, pipe.vae
    te_engine, te = _stage(TextEncoderGraph(float32_copy(text)), token_ids(pipe), "text_encoder", scratch_root,
                           int8w)
    g = torch.Generator("cpu").manual_seed(0)
    latents = torch.randn(latent_shape(pipe, workload), generator=g)
    dec_graph = DecoderGraph(*(float32_copy(m) if m is not None else None for m in (vae.post_quant_conv, vae.decoder)))
    dec_engine, dec = _stage(dec_graph, latents, "vae_decoder", scratch_root, int8w)
    pipe.text_encoder = EngineTextEncoder(te_engine, text.config, text.dtype, te)
    vae.decoder = EngineVAEDecoder(dec_engine, dec)
    if vae.post_quant_conv is not None:
        vae.post_quant_conv = torch.nn.Identity()
    facts = {"stages_engine": f"openvino {ov.__version__}", "stages_precision": te["precision"],
             "stages_weights": te["weights"], "stages_replaced": REPLACED,
             "stages_export_s": te["export_s"] + dec["export_s"], "stages_build_s": te["build_s"] + dec["build_s"]}
    for stage, f in (("text_encoder", te), ("vae_decoder", dec)):
        facts.update({f"{stage}_{k}": v for k, v in f.items() if k != "exporter"})
    return pipe, facts


def _applied(variant: str):
    def run(pipe, ctx):
        from sdperf.measure.timing import peak_memory

        pipe, facts = apply(pipe, variant, ctx.workload(), scratch_root=ctx.artefacts)
        ctx.facts.update(facts)
        # the generic set-up facts 07's tables read; a UNet engine's own win (setdefault)
        for k, v in (("engine", facts["stages_engine"]), ("exporter", EXPORTER),
                     ("export_s", facts["stages_export_s"]), ("build_s", facts["stages_build_s"]),
                     ("precision", facts["stages_precision"]), ("dynamic_batch", False), ("static_shapes", True),
                     ("setup_peak_mib", peak_memory(ctx.device)[0] / 2**20)):
            ctx.facts.setdefault(k, v)
        return pipe
    return run


def techniques() -> list[Technique]:
    """stages:<variant>: the text encoder and the VAE decoder run by OpenVINO (see VARIANTS); the UNet untouched."""
    return [Technique(f"stages:{v}", LABELS[v], STAGES, NOTEBOOK, transfer=TRANSFER, apply=_applied(v),
                      availability=lambda ctx, v=v: availability(ctx.profile, v), changes_output=v != "openvino-f32",
                      loop_only=False, note=VARIANTS[v],
                      extra_copies={"vae": 1, "text_encoder": 1, "text_encoder_2": 1}, packages=VARIANT_PACKAGES[v]) for v in VARIANTS]
