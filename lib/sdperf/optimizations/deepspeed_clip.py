"""The CLIP layout adapter that DeepSpeed's kernel injection needs under transformers >= 5.6: one function that both
the injection rung (deepspeed_inference, which applies it) and the policy check run on the CPU
(deepspeed_policies, which applies it to a copy) use, so neither module imports the other for it."""
from __future__ import annotations


def adapt_clip_layout(text_encoder):
    """sdperf's CLIP layout adapter, applied only by the deepspeed:inject-clip-adapter rung.

    transformers >= 5.6 flattened CLIPTextModel (transformers #46285, which reports 5.5.4 unaffected; the lock's
    5.23.0 has no `text_model`), and DeepSpeed's DSClipEncoder, which generic_injection wraps around
    `pipe.text_encoder` (DeepSpeed 0.19.8, read here), reads `enc.text_model` to replace its
    `_build_causal_attention_mask`: an AttributeError before anything is injected. The adapter points
    `text_model` at the model itself, which since 5.6 holds the embeddings / encoder / final_layer_norm that the
    inner CLIPTextTransformer held. A plain attribute, not a submodule, so state_dict(), .to() and named_modules()
    see no cycle. The method DSClipEncoder then sets is one transformers 5.23 never calls (CLIP builds its causal
    mask itself), so the text encoder computes what it computes without the adapter. A no-op where `text_model`
    exists. Checked on the CPU by deepspeed_policies.policy_table (tests/test_opt_deepspeed.py)."""
    if not hasattr(text_encoder, "text_model"):
        object.__setattr__(text_encoder, "text_model", text_encoder)
    return text_encoder
