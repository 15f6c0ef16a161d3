"""generate_folder(): one image per (prompt id, guidance, seed) into a folder, split between the launched ranks;
each generates what of its round-robin share is not on disk, so a restart fills gaps and 1 or N ranks agree.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sdperf.core.errors import ConfigError
from sdperf.imagegen import keys as K
from sdperf.imagegen import ranks as R
from sdperf.imagegen import store
from sdperf.config.profiles import DTYPES, Profile, load_profile

OVERALL_REFRESH_S = 1.0
ROW_AFTER_IMAGE_SLACK_S = 1.0  # a row is written just after its image's rename, its time rounded to milliseconds
DEFAULT_GRAD_MODE = "inference_mode"


@dataclass
class RankStats:
    """What one rank did in this run; setup (pipeline build) is kept apart from the images' time."""

    rank: int
    planned: int  # keys in this rank's share
    already_done: int  # of those, on disk before this run
    generated: int
    rows_recovered: int  # images a killed run wrote without their manifest row
    setup_s: float
    seconds: float  # first image started -> last image written
    start_unix: float | None = None
    end_unix: float | None = None

    @property
    def images_per_s(self) -> float | None:
        return self.generated / self.seconds if self.generated and self.seconds > 0 else None


@dataclass
class Summary:
    out_dir: str
    profile: str
    world_size: int
    keys: int  # images planned for the whole run (all ranks)
    ranks: list[RankStats] = field(default_factory=list)
    rank: int = 0  # the rank this summary was returned on

    @property
    def gathered(self) -> bool:
        """True when it holds every rank (one process, or a launch with a process group)."""
        return len(self.ranks) == self.world_size

    @property
    def reports_here(self) -> bool:
        """Whether this rank prints and stores the summary: rank 0 of a group, or each independent shard."""
        return self.rank == 0 or not self.gathered

    @property
    def generated(self) -> int:
        return sum(r.generated for r in self.ranks)

    @property
    def seconds(self) -> float:
        """Wall time of the generation across ranks: earliest first image to latest last image."""
        spans = [(r.start_unix, r.end_unix) for r in self.ranks if r.generated]
        return max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0.0

    @property
    def images_per_s(self) -> float | None:
        return self.generated / self.seconds if self.generated and self.seconds > 0 else None

    def table(self):
        import pandas as pd

        rows = [dict(asdict(r), images_per_s=r.images_per_s) for r in self.ranks]
        rows.append(dict(rank="total", planned=sum(r.planned for r in self.ranks),
                         already_done=sum(r.already_done for r in self.ranks), generated=self.generated,
                         rows_recovered=sum(r.rows_recovered for r in self.ranks), seconds=self.seconds,
                         images_per_s=self.images_per_s))
        return pd.DataFrame(rows, columns=["rank", "planned", "already_done", "generated", "rows_recovered", "setup_s",
                                           "seconds", "images_per_s"])

    def to_dict(self) -> dict:
        return dict(out_dir=self.out_dir, profile=self.profile, world_size=self.world_size, keys=self.keys,
                    ranks_reported=len(self.ranks), generated=self.generated, seconds=self.seconds,
                    images_per_s=self.images_per_s,
                    ranks=[dict(asdict(r), images_per_s=r.images_per_s) for r in self.ranks])

    def __str__(self) -> str:
        table = self.table().to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")
        return (f"generated {self.generated} images ({self.keys} planned) into {self.out_dir} on "
                f"{self.world_size} rank(s), profile {self.profile}\n{table}")


def _captions(captions) -> dict[str, str]:
    """id -> text from a list of prompts.Caption, or from a captions file path."""
    from sdperf.model import prompts

    if isinstance(captions, (str, os.PathLike)):
        captions = prompts.load_captions(captions)
    captions = list(captions)
    if not captions:
        raise ConfigError("captions: the list is empty; give prompts.load_captions(path) or prompts.smoke_captions()")
    out: dict[str, str] = {}
    for c in captions:
        if c.id in out:
            raise ConfigError(f"captions: id {c.id!r} occurs more than once; ids name the images, so each must be "
                              "unique")
        out[c.id] = c.text
    return out


def _settings(p: "Plan") -> dict:
    """What the pixels depend on: resuming into a folder made with other values would mix two studies."""
    prof = p.profile
    out = dict(profile=prof.name, arch=prof.arch, resolution=prof.resolution, steps=p.steps,
               scheduler=prof.scheduler, dtype=p.dtype, weights=prof.weights, weights_seed=prof.seed,
               captions_sha256=store.captions_sha256(p.captions))
    # recorded only when set, so folders made before these existed still resume
    if p.grad_mode != DEFAULT_GRAD_MODE:
        out["grad_mode"] = p.grad_mode
    if p.technique:
        out["technique"] = p.technique
    return out


def _pipe_dtype(pipe) -> str:
    from sdperf.model.generation import module_dtype

    return str(module_dtype(pipe.unet)).removeprefix("torch.")


@dataclass
class Plan:
    """Everything checked before a model is built."""

    profile: Profile
    captions: dict[str, str]
    keys: list[K.ImageKey]
    units: list[tuple[K.ImageKey, ...]]
    out_dir: Path
    ranks: R.Ranks
    dtype: str
    steps: int
    grad_mode: str = "inference_mode"
    technique: str | None = None


def plan(profile, captions, out_dir, guidance_scales=None, seeds=None, rank=None, world_size=None,
         batch_size: int = 1, dtype: str | None = None, pipe=None, steps: int | None = None,
         grad_mode: str = "inference_mode", technique: str | None = None) -> Plan:
    """Validate every input (fast, no model): bad values fail naming the value and the valid choices."""
    from sdperf.model.generation import GRAD_MODES

    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    texts = _captions(captions)
    from sdperf.model import prompts

    prompts.check_token_lengths(texts)
    guidance = K.check_guidance([prof.guidance_scale] if guidance_scales is None else guidance_scales)
    seeds = None if seeds is None else K.check_seeds(seeds)
    if pipe is not None:
        dtype = _pipe_dtype(pipe)
    elif dtype is None:
        dtype = prof.dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not valid; choose one of: {', '.join(DTYPES)}")
    steps = prof.steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps {steps!r} is not valid; choose an integer >= 1 (the profile's is {prof.steps})")
    if grad_mode not in GRAD_MODES:
        raise ConfigError(f"grad_mode {grad_mode!r} is not valid; choose one of: {', '.join(GRAD_MODES)}")
    if technique is not None and pipe is None:
        raise ConfigError(f"technique {technique!r} names what was applied to a pipeline: give that pipeline as pipe")
    keys = K.plan_keys(texts, guidance, seeds, base_seed=prof.seed)
    return Plan(prof, texts, keys, K.work_units(keys, batch_size), store.check_out_dir(out_dir),
                R.detect(rank, world_size), dtype, steps, grad_mode, technique)


def generate_folder(profile, captions, out_dir, guidance_scales=None, seeds=None, rank=None, world_size=None,
                    pipe=None, progress: bool = True, batch_size: int = 1, dtype: str | None = None,
                    steps: int | None = None, grad_mode: str = "inference_mode",
                    technique: str | None = None) -> Summary:
    """Generate this rank's missing images of every (caption id, guidance, seed) into out_dir; the summary.
    `profile`: a Profile or name; `captions`: prompts.Caption list or file. `pipe` reuses a built pipeline; a
    technique's comes with its `grad_mode` and key as `technique` (recorded in run.json)."""
    p = plan(profile, captions, out_dir, guidance_scales, seeds, rank, world_size, batch_size, dtype, pipe, steps,
             grad_mode, technique)
    p.out_dir.mkdir(parents=True, exist_ok=True)
    store.claim_run_settings(p.out_dir, _settings(p))
    store.check_captions(p.out_dir, p.captions)
    with R.process_group(p.ranks):
        stats = _run_share(p, pipe, progress)
        everyone = R.gather(p.ranks, stats)  # the barrier before the merge
        summary = Summary(str(p.out_dir), p.profile.name, p.ranks.world_size, len(p.keys), everyone, p.ranks.rank)
        if summary.reports_here:
            store.rebuild_manifest(p.out_dir)
            name = store.SUMMARY if summary.gathered else f"{store.PARTS_DIR}/rank-{p.ranks.rank}.summary.json"
            store.atomic_write_text(p.out_dir / name, json.dumps(summary.to_dict(), indent=2) + "\n")
        R.gather(p.ranks, None)  # every rank returns after the manifest is written
    return summary


def _run_share(p: Plan, pipe, progress: bool) -> RankStats:
    from sdperf.core import environment

    mine = [k for unit in K.shard(p.units, p.ranks.rank, p.ranks.world_size) for k in unit]
    commit = environment.git_commit()
    with store.ManifestPart(p.out_dir, p.ranks.rank) as part:  # locked: no other launch of this rank is writing
        store.remove_stale_temps(p.out_dir, mine)
        done = store.existing(p.out_dir, mine)
        recovered = _recover_rows(p, part, done, commit)
        todo = [tuple(k for k in unit if k not in done)
                for unit in K.shard(p.units, p.ranks.rank, p.ranks.world_size)]
        todo = [u for u in todo if u]
        R.gather(p.ranks, None)  # every rank's recovered rows are in before the overall count starts
        setup = time.perf_counter()
        if todo and pipe is None:
            pipe = _build(p)
        stats = RankStats(p.ranks.rank, len(mine), len(done), 0, recovered, time.perf_counter() - setup, 0.0)
        with _Progress(p, len(mine), len(done), enabled=progress) as bar:
            _generate_units(p, pipe, todo, part, commit, stats, bar)
    return stats


def _recover_rows(p: Plan, part: store.ManifestPart, done: set, commit: str) -> int:
    """Rows for images a killed run renamed into place but did not record, or whose latest row predates the file."""
    recorded: dict = {}
    for row in store.read_parts(p.out_dir):
        key = store.row_key(row)
        recorded[key] = max(recorded.get(key, row["time_utc"]), row["time_utc"])
    missing = []
    for key in sorted(done):
        mtime = os.stat(p.out_dir / key.relpath).st_mtime
        if key not in recorded or store.unix_from_utc(recorded[key]) < mtime - ROW_AFTER_IMAGE_SLACK_S:
            part.append(_row(p, key, commit, store.utc_from_unix(mtime)))
            missing.append(key)
    return len(missing)


def _row(p: Plan, key: K.ImageKey, commit: str, when: str) -> dict:
    return dict(key=key.name, prompt_id=key.prompt_id, caption=p.captions[key.prompt_id], guidance=key.guidance,
                seed=key.seed, file=key.relpath, steps=p.steps, resolution=p.profile.resolution,
                profile=p.profile.name, dtype=p.dtype, commit=commit, time_utc=when, rank=p.ranks.rank)


def _build(p: Plan):
    """The profile's pipeline (Study.pipeline's build), on this rank's own GPU when there are several."""
    import torch

    from sdperf.model.pipelines import build_pipeline

    device = p.profile.device
    if device == "cuda" and p.ranks.world_size > 1:
        torch.cuda.set_device(p.ranks.local_rank)
        device = f"cuda:{p.ranks.local_rank}"
    return build_pipeline(p.profile, device=device, dtype=getattr(torch, p.dtype))


def _generate_units(p: Plan, pipe, todo, part, commit: str, stats: RankStats, bar) -> None:
    from sdperf.imagegen.render import render

    stats.start_unix = time.time()
    start = time.perf_counter()
    for unit in todo:
        images = render(pipe, p.profile, [(p.captions[k.prompt_id], k.guidance, k.seed) for k in unit], p.steps,
                        p.grad_mode)
        for key, image in zip(unit, images):
            store.write_image(p.out_dir, key, image)  # the image first (temp + rename), then its row
            part.append(_row(p, key, commit, store.utc_now()))
            stats.generated += 1
        bar.advance(len(unit))
    stats.seconds = time.perf_counter() - start
    stats.end_unix = time.time()


class _Progress:
    """A tqdm bar per rank (one line each) and, on rank 0, the overall count read from every rank's part."""

    def __init__(self, p: Plan, total: int, initial: int, enabled: bool):
        from tqdm.auto import tqdm

        self.enabled, self.p = enabled, p
        r = p.ranks
        self.mine = tqdm(total=total, initial=initial, desc=f"rank {r.rank}", unit="img", position=r.local_rank,
                         disable=not enabled, dynamic_ncols=True, leave=True)
        self.overall = None
        if enabled and r.is_main and r.world_size > 1:
            self.counter = _PartsCounter(p.out_dir)
            start = len(store.existing(p.out_dir, p.keys))
            self.overall = tqdm(total=len(p.keys), initial=start, desc="all ranks", unit="img",
                                position=r.local_world_size, dynamic_ncols=True, leave=True)
            self._last = time.monotonic()

    def advance(self, n: int) -> None:
        self.mine.update(n)
        if self.overall is not None and time.monotonic() - self._last >= OVERALL_REFRESH_S:
            self._refresh()

    def _refresh(self) -> None:
        self.overall.update(min(self.counter.new_rows(), self.overall.total - self.overall.n))
        self._last = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.overall is not None:
            self._refresh()
            self.overall.close()
        self.mine.close()


class _PartsCounter:
    """Rows appended to any rank's part since it was made: the overall count, at the cost of reading new bytes."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.offsets = {path: path.stat().st_size for path in store.part_files(out_dir)}

    def new_rows(self) -> int:
        """Rows added since the last call."""
        n = 0
        for path in store.part_files(self.out_dir):
            start = self.offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                chunk = fh.read()
            complete = chunk.rfind(b"\n") + 1  # a line still being written is counted next time
            n += chunk[:complete].count(b"\n")
            self.offsets[path] = start + complete
        return n
