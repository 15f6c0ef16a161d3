"""The CLIP layout adapter DeepSpeed's kernel injection needs under transformers >= 5.6, shared by deepspeed_inference
and deepspeed_policies so neither imports the other for it."""
from __future__ import annotations


def adapt_clip_layout(text_encoder):
    """Point `text_model` at the model itself (a no-op where it exists): transformers >= 5.6 flattened CLIPTextModel
    and DSClipEncoder reads `enc.text_model`. A plain attribute, not a submodule, so state_dict(), .to() and
    named_modules() see no cycle; the method DSClipEncoder then sets is never called, so the output is unchanged."""
    if not hasattr(text_encoder, "text_model"):
        object.__setattr__(text_encoder, "text_model", text_encoder)
    return text_encoder
