"""Which modules of a diffusers pipeline DeepSpeed's kernel injection would replace, found by DeepSpeed's own code
on a CPU without building a kernel, so a release that moves a class DeepSpeed reads fails in CI, not on a GPU.

`deepspeed.module_inject.generic_injection` runs on copies of the pipeline's components with the fused-kernel module
replaced by an empty namespace: DeepSpeed's op bindings take their pure-PyTorch fallbacks, so the policies' `match`,
their getters, the weight copies and the module swaps all run; the result cannot run forward here.

One row per policy, each examined on its own: the wrapper on `text_encoder`, every policy of `generic_policies`
(UNet, VAE), and the transformer-layer policies of `replace_policies` that match a layer of the pipeline. The
expected classes are the policies' own `_orig_layer_class`, read from DeepSpeed, never copied.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import re
import types
import warnings

import pandas as pd
import torch

from sdperf.optimizations.deepspeed_clip import adapt_clip_layout

COLUMNS = ("policy", "expected_class", "matched", "replaced", "missing", "error", "applied_by_generic_injection",
           "note")
CLIP_WRAPPER = "DSClipEncoder"
TEXT_ENCODER = "text_encoder"  # the attribute generic_injection wraps, whatever its class
_NO_ATTRIBUTE = re.compile(r"(?:'(\w+)' object|module '([\w.]+)') has no attribute '(\w+)'")


class _Holder:
    """What generic_injection walks, like a pipeline: an object whose attributes are the components."""

    def __init__(self, **components):
        self.__dict__.update(components)


def components(pipe) -> dict[str, torch.nn.Module]:
    """The nn.Module attributes of a pipeline (or of any object holding them), as generic_injection finds them."""
    found = {k: v for k, v in getattr(pipe, "__dict__", {}).items() if isinstance(v, torch.nn.Module)}
    if not found:
        raise ValueError(f"{type(pipe).__name__} holds no nn.Module attribute: pass a diffusers pipeline")
    return found


def _qualname(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@contextlib.contextmanager
def _no_kernels():
    """DeepSpeed with an empty fused-kernel module, its prints and warnings swallowed. The class state it keeps is
    put back afterwards, so a real injection later in the same process starts as if this had not run."""
    from deepspeed.ops.transformer.inference.diffusers_attention import DeepSpeedDiffusersAttention
    from deepspeed.ops.transformer.inference.op_binding.base import BaseOp

    saved = BaseOp.inference_module, DeepSpeedDiffusersAttention.layer_id
    BaseOp.inference_module = types.SimpleNamespace()
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        BaseOp.inference_module, DeepSpeedDiffusersAttention.layer_id = saved


def _slots(holder: _Holder) -> list[tuple[str, object, str, object]]:
    """(path, parent, attribute, module) for every component of the holder and every module under it."""
    out = []
    for name, comp in components(holder).items():
        out.append((name, holder, name, comp))
        for path, module in comp.named_modules(prefix=name):
            out += [(f"{path}.{child}", module, child, sub) for child, sub in module.named_children()]
    return out


def _now_at(parent, attr: str):
    return parent._modules.get(attr) if isinstance(parent, torch.nn.Module) else getattr(parent, attr, None)


def _missing(exc: AttributeError) -> str:
    """'Class.attribute' or 'package.module.name' from an AttributeError (its message when it names neither)."""
    m = _NO_ATTRIBUTE.search(str(exc))
    return f"{m.group(1) or m.group(2)}.{m.group(3)}" if m else str(exc)


def inject(holder: _Holder) -> tuple[dict[str, str], list[str], str]:
    """generic_injection(holder, float16, no CUDA graph) without kernels, on the holder as given (it is changed
    in place: pass copies). Returns (replaced: path -> DeepSpeed class put there, missing attributes, other error)."""
    from deepspeed.module_inject import generic_injection

    before = _slots(holder)
    missing, error = [], ""
    try:
        with _no_kernels():
            generic_injection(holder, dtype=torch.float16, enable_cuda_graph=False)
    except AttributeError as exc:
        missing.append(_missing(exc))
    except Exception as exc:  # noqa: BLE001 - any other way the real call stops is what the row reports
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    replaced = {}
    for path, parent, attr, module in before:
        now = _now_at(parent, attr)
        if now is not module and now is not None and type(now).__module__.startswith("deepspeed."):
            replaced[path] = type(now).__name__
    return replaced, missing, error


def _text_encoder_copy(comps: dict, clip_adapter: bool):
    te = copy.deepcopy(comps[TEXT_ENCODER])
    return adapt_clip_layout(te) if clip_adapter else te


def _row(policy, expected, matched, replaced=None, missing=(), error="", applied=True, note="") -> dict:
    return dict(zip(COLUMNS, (policy, expected, tuple(matched), dict(replaced or {}), tuple(missing), error, applied,
                              note)))


def _wrapper_row(comps: dict, clip_adapter: bool) -> dict:
    note = "generic_injection wraps pipe.text_encoder first, whatever its class, and reads its .text_model"
    if TEXT_ENCODER not in comps:
        return _row(CLIP_WRAPPER, f"a '{TEXT_ENCODER}' attribute", (), error=f"the pipeline has no {TEXT_ENCODER}",
                    note=note)
    replaced, missing, error = inject(_Holder(text_encoder=_text_encoder_copy(comps, clip_adapter)))
    return _row(CLIP_WRAPPER, _qualname(type(comps[TEXT_ENCODER])), (TEXT_ENCODER,), replaced, missing, error,
                note=note + ("; with sdperf's CLIP layout adapter" if clip_adapter else ""))


def _generic_rows(comps: dict) -> list[dict]:
    """Each of generic_policies: the components it matches, and what generic_injection does to a copy of each
    (past the text-encoder wrapper, adapted so that the component is reached)."""
    from deepspeed.module_inject.replace_policy import generic_policies

    rows = []
    # one adapted copy of the text encoder serves every component: DSClipEncoder only wraps it
    passable = {TEXT_ENCODER: _text_encoder_copy(comps, clip_adapter=True)} if TEXT_ENCODER in comps else {}
    for cls in generic_policies:
        try:
            policy = cls()
            expected = policy._orig_layer_class
        except AttributeError as exc:  # the policy cannot even find its class in this diffusers
            rows.append(_row(cls.__name__, "not found", (), missing=[_missing(exc)]))
            continue
        if expected is None:
            rows.append(_row(cls.__name__, "None", (), error="the policy found no class to match (ImportError)"))
            continue
        matched = [name for name, comp in comps.items() if policy.match(comp)]
        replaced, missing, errors = {}, [], []
        for name in matched:
            parts = {**passable, name: copy.deepcopy(comps[name])}
            got, miss, err = inject(_Holder(**parts))
            replaced.update({p: c for p, c in got.items() if p.split(".")[0] == name})
            missing += miss
            errors += [err] if err else []
        kept = "; its attention() gives None: the Attention modules inside are kept" if cls.__name__ == "VAEPolicy" \
            else ""
        rows.append(_row(cls.__name__, _qualname(expected), matched, replaced, missing, "; ".join(errors),
                         note="examined past the text-encoder wrapper (its own row)" + kept))
    return rows


def _layer_classes(cls) -> tuple:
    cls(None)  # DeepSpeed's own way to populate _orig_layer_class (replace_module.replace_module)
    found = cls._orig_layer_class
    return tuple(c for c in (found if isinstance(found, list) else [found]) if c is not None)


LAYER_GETTERS = ("get_hidden_heads", "attention", "mlp", "layernorm")


def _layer_rows(comps: dict) -> list[dict]:
    """The replace_policies whose class is exactly a layer's of the pipeline, every getter called on each layer."""
    from deepspeed.module_inject.replace_policy import replace_policies

    rows = []
    for cls in replace_policies:
        try:
            classes = _layer_classes(cls)
        except Exception:  # noqa: BLE001 - a policy of another model family that cannot load here matches nothing
            continue
        matched = [(path, m) for name, comp in comps.items() for path, m in comp.named_modules(prefix=name)
                   if m.__class__ in classes]
        if not matched:
            continue
        missing, errors = [], []
        for _, layer in matched:
            policy = cls(layer)
            for getter in LAYER_GETTERS:
                try:
                    getattr(policy, getter)()
                except AttributeError as exc:
                    missing.append(_missing(exc))
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{getter}: {type(exc).__name__}: {exc}")
        rows.append(_row(cls.__name__, ", ".join(_qualname(c) for c in classes), [p for p, _ in matched],
                         missing=dict.fromkeys(missing), error="; ".join(dict.fromkeys(errors)), applied=False,
                         note="getters " + ", ".join(LAYER_GETTERS) + " called on every matched layer; "
                              "init_inference on the text encoder alone applies this policy, generic_injection "
                              "does not (its call is commented out in DeepSpeed 0.19.8)"))
    return rows


def policy_table(pipe, clip_adapter: bool = False) -> pd.DataFrame:
    """DeepSpeed's policies against this pipeline's modules (COLUMNS), on copies. `clip_adapter`: examine the text
    encoder with sdperf's CLIP layout adapter."""
    comps = components(pipe)
    rows = [_wrapper_row(comps, clip_adapter)] + _generic_rows(comps) + _layer_rows(comps)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def mismatches(table: pd.DataFrame, applied_only: bool = True) -> list[str]:
    """Why DeepSpeed's injection would fail on `table`'s pipeline, a line per policy (`applied_only`: applied ones)."""
    out = []
    for row in table.itertuples():
        if applied_only and not row.applied_by_generic_injection:
            continue
        if row.missing:
            out.append(f"{row.policy}: missing {', '.join(row.missing)}")
        if row.error:
            out.append(f"{row.policy}: {row.error}")
        if not row.matched and not row.error and not row.missing:
            out.append(f"{row.policy}: matches no component (it expects {row.expected_class})")
    return out


def tiny_twin() -> _Holder:
    """The tiny SD architecture's components at random init (SD 1.5's module classes) in a holder, built under a
    forked RNG so that the caller's random stream is not moved."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from sdperf.config import architectures

    arch = architectures.get("tiny")
    with torch.random.fork_rng(devices=[]):
        return _Holder(text_encoder=CLIPTextModel(CLIPTextConfig(**arch.text_encoder)),
                       unet=UNet2DConditionModel(**arch.unet), vae=AutoencoderKL(**arch.vae))


@functools.lru_cache(maxsize=1)
def _twin() -> _Holder:
    return tiny_twin()  # policy_table works on copies, so one build serves every check of the process


@functools.lru_cache(maxsize=2)
def twin_mismatches(clip_adapter: bool) -> tuple[str, ...]:
    """mismatches() of the tiny twin, once per process: what the rung's availability adds to its reason."""
    return tuple(mismatches(policy_table(_twin(), clip_adapter=clip_adapter)))
