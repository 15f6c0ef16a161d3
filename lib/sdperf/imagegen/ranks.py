"""Who this process is among the launched ones: torch.distributed when a launcher (torchrun, accelerate) set it up.
Gloo only agrees and gathers; images go to a shared folder, on one machine or several."""
from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass

import torch.distributed as dist

from sdperf.core.errors import ConfigError

GATHER_TIMEOUT = dt.timedelta(hours=48)  # the slowest rank may finish long after the fastest


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"${name}={value!r} is not an integer; launchers such as torchrun set it") from None


def detect(rank: int | None = None, world_size: int | None = None) -> Ranks:
    """Explicit values, else an initialized process group, else torchrun's RANK/WORLD_SIZE, else one process."""
    if world_size is None:
        world_size = dist.get_world_size() if _initialized() else _env_int("WORLD_SIZE", 1)
    if rank is None:
        rank = dist.get_rank() if _initialized() else _env_int("RANK", 0)
    for name, value in (("world size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} {value!r} is not an integer")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} / world size {world_size} is not valid; need world size >= 1 and "
                          f"rank in 0..{world_size - 1}")
    local_world = _env_int("LOCAL_WORLD_SIZE", world_size)
    return Ranks(rank, world_size, _env_int("LOCAL_RANK", rank % local_world), local_world)


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def process_group(ranks: Ranks):
    """A gloo group when a launcher gave a rendezvous (MASTER_ADDR); else the caller's group, or independent shards."""
    if ranks.world_size == 1 or _initialized() or "MASTER_ADDR" not in os.environ:
        yield
        return
    dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world_size, timeout=GATHER_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def gather(ranks: Ranks, obj) -> list:
    """Every rank's object, in rank order, on every rank; also the barrier before the merge step."""
    if not _initialized():  # one process, or independent shards: only this rank's own
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
