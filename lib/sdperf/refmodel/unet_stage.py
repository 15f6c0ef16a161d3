"""The UNet stage of `sdperf train-reference`, one process per rank under torchrun (as notebook 11 runs training).

    torchrun --standalone --nproc_per_node 2 -m sdperf.refmodel.unet_stage --work DIR

Each rank trains the same seeded `sdref.Conditioned` in DDP by the study's own step (`sdperf.training.step`); step
s of rank r draws its data from (recipe seed, s, r) alone, so a killed run resumes into the same steps. EMA is kept.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

LATENTS, CHECKPOINT, RESULT, DONE = "latents.pt", "unet-checkpoint.pt", "unet-ema.pt", "unet-done.json"


class RankNoise:
    """Each rank's noise generator as one checkpoint part: gathered to every rank on save, own state on load."""

    def __init__(self, generator: torch.Generator, rank: int, world: int):
        self.generator, self.rank, self.world = generator, rank, world

    def state_dict(self) -> dict:
        state = self.generator.get_state()
        if self.world == 1:
            return {"states": [state]}
        states = [None] * self.world
        dist.all_gather_object(states, state)
        return {"states": states}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["states"][self.rank])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True, help="the train-reference work folder (recipe.json, latents.pt)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--kill-after-save", type=int, default=None, help=argparse.SUPPRESS)  # tests: SIGKILL here
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if world > 1:
        dist.init_process_group("gloo")
    train(Path(args.work), rank, world, show=rank == 0 and not args.no_progress, kill_after_save=args.kill_after_save)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def train(work: Path, rank: int, world: int, show: bool, kill_after_save: int | None = None) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from sdperf.refmodel import loop, sdref
    from sdperf.refmodel.training_recipe import Recipe
    from sdperf.training.step import Trainer

    recipe = Recipe.from_dict(json.loads((work / "recipe.json").read_text()))
    data = torch.load(work / LATENTS, map_location="cpu", weights_only=True)
    latents, index, ids, empty = data["latents"], data["caption_index"], data["ids"], data["empty"]
    pipe = sdref.build(recipe.seed)
    net = sdref.Conditioned(pipe.unet, pipe.text_encoder).train().requires_grad_(True)
    wrapped = DistributedDataParallel(net) if world > 1 else net
    trainer = Trainer(wrapped, sdref.noise_scheduler(), "cpu", learning_rate=recipe.unet_lr, weight_decay=1e-2,
                      max_grad_norm=1.0, autocast_mode="none", seed=recipe.seed * 100_003 + rank)
    schedule = loop.cosine_with_warmup(trainer.optimizer, recipe.warmup, recipe.unet_steps)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(recipe.ema))
    per_rank = recipe.unet_batch // world

    def step(s: int) -> float:
        rng = np.random.default_rng([recipe.seed, s, rank])
        pick = torch.as_tensor(rng.integers(len(latents), size=per_rank))
        tokens = ids[index[pick]].clone()
        tokens[torch.as_tensor(rng.random(per_rank) < recipe.caption_dropout)] = empty
        value = trainer.step({"latents": latents[pick], "embeds": tokens})
        schedule.step()
        ema.update_parameters(net)
        return float(value)

    def on_save(done: int) -> None:
        if kill_after_save is not None and done >= kill_after_save and rank == 0:
            os.kill(os.getpid(), 9)

    parts = {"model": net, "optimizer": trainer.optimizer, "schedule": schedule, "ema": ema,
             "noise": RankNoise(trainer.generator, rank, world)}
    curve = loop.run(work / CHECKPOINT, parts, recipe.unet_steps, step, every=recipe.checkpoint_every, desc="unet",
                     show=show, on_save=on_save, write=rank == 0)
    if rank == 0:
        loop.save(work / RESULT, {"unet": ema.module.unet.state_dict(),
                                  "text_encoder": ema.module.text_encoder.state_dict()})
        loop.save_json(work / DONE, {"steps": recipe.unet_steps, "world_size": world, "curve": curve})


if __name__ == "__main__":
    raise SystemExit(main())
