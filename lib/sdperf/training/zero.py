"""DeepSpeed ZeRO stage 1/2 for the same training step: the config the library writes, and the engine.

ZeRO-1 shards the AdamW moments across ranks, ZeRO-2 the gradients too; both keep full weights on every rank, so the
step and its loss are DDP's and only per-rank memory and communication differ. The optimizer is the DDP runs' torch
AdamW handed to deepspeed.initialize (hence zero_allow_untested_optimizer); autocast wraps the forward as under DDP,
and no DeepSpeed fp16/bf16 section is written (it would cast the weights and change what is compared).
"""
from __future__ import annotations

import json
from pathlib import Path

from sdperf.store.results import atomic_write_text

STAGES = {"zero1": 1, "zero2": 2}


def availability(engine: str, autocast_mode: str) -> tuple[bool, str]:
    if engine not in STAGES:
        return True, "DDP"
    if autocast_mode == "float16":
        return False, ("fp16 autocast needs a loss scaler, which DeepSpeed applies only in its own fp16 mode "
                       "(that casts the weights and would change what is compared); use autocast: bfloat16")
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # ImportError, or an accelerator probe that fails at import
        return False, f"deepspeed cannot be imported here: {type(exc).__name__}: {exc}"
    return True, f"DeepSpeed ZeRO stage {STAGES[engine]}"


def config(engine: str, per_rank_batch: int, world_size: int, max_grad_norm: float) -> dict:
    """The DeepSpeed JSON config of one run (no gradient accumulation: one micro batch per optimizer step)."""
    return {
        "train_micro_batch_size_per_gpu": per_rank_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": per_rank_batch * world_size,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": {"stage": STAGES[engine], "contiguous_gradients": True, "overlap_comm": True},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # no progress lines in the timed loop
        "wall_clock_breakdown": False,
    }


def write_config(path: Path, cfg: dict) -> Path:
    atomic_write_text(Path(path), json.dumps(cfg, indent=2) + "\n")
    return Path(path)


SHM_COMM_OP = "deepspeed_shm_comm"  # DeepSpeed's shared-memory all-reduce for CPU ranks (ShareMemCommBuilder.NAME)


def without_shm_comm() -> None:
    """Mark DeepSpeed's shared-memory comm op unavailable before deepspeed.init_distributed builds it: on a CPU it
    JIT-compiles it with g++ (tens of seconds, per venv path) for inference_all_reduce, which ZeRO training never
    calls (its collectives go through torch.distributed). DeepSpeed reads edits to its dict of compatible ops."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False


def initialize(unet, optimizer, config_path: Path):
    """deepspeed.initialize with the client optimizer; returns the engine (its .module is the UNet)."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=unet, optimizer=optimizer, config=str(config_path))
    return engine
