"""FID / CLIP of a generated folder (sdperf.imagegen), sharded like its generation: each rank scores its share of the
manifest and saves, per guidance scale, its Inception sums (they add up) and per-image CLIP scores; the merge adds
the statistics and joins the scores, giving what score.score_manifest gives for the whole folder in one process.
Under torchrun `score_folder` does both; independent jobs each run `score_shard`, then one runs `merge_scores`.

    DIR/scores/<name>/world-<W>/g<guidance>/rank-<r>.npz       Inception sums of rank r's share (fid.save_stats)
    DIR/scores/<name>/world-<W>/g<guidance>/rank-<r>-clip.csv  key, prompt_id, seed, clip: a row per image
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sdperf.core.errors import ConfigError
from sdperf.imagegen import ranks as R
from sdperf.imagegen.keys import guidance_dir
from sdperf.imagegen.store import KEY_COLUMNS
from sdperf.store.results import atomic_write_text

SCORES_DIR = "scores"


def shard_rows(manifest: pd.DataFrame, rank: int, world_size: int) -> pd.DataFrame:
    """Round robin over the rows sorted by key: every rank agrees, whatever order the table came in."""
    ordered = manifest.sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)
    return ordered.iloc[rank::world_size]


def shard_dir(out_dir, name: str, world_size: int) -> Path:
    """One folder per scoring and world size, so a merge never mixes the shards of two different splits."""
    return Path(out_dir) / SCORES_DIR / name / f"world-{world_size}"


def score_shard(out_dir, scorers, name: str = "quality", rank: int | None = None, world_size: int | None = None,
                manifest: pd.DataFrame | None = None) -> Path:
    """Score this rank's share of every guidance scale (an empty share still writes its empty statistics)."""
    from sdperf.quality import fid, score
    from sdperf.quality.images import read_manifest

    ranks = R.detect(rank, world_size)
    table = read_manifest(Path(out_dir)) if manifest is None else manifest
    mine = shard_rows(table, ranks.rank, ranks.world_size)
    folder = shard_dir(out_dir, name, ranks.world_size)
    for g in sorted(table["guidance"].unique()):
        rows = mine[mine["guidance"] == g]
        scored = score.score_files(scorers, list(rows["path"]), list(rows["caption"]))
        base = folder / guidance_dir(g)
        fid.save_stats(scored.stats, base / f"rank-{ranks.rank}.npz")
        clip = scored.clip if scored.clip is not None else np.full(len(rows), np.nan)
        atomic_write_text(base / f"rank-{ranks.rank}-clip.csv",
                          rows[["key", "prompt_id", "seed"]].assign(clip=clip).to_csv(index=False))
    return folder


def merge_scores(out_dir, name: str = "quality", world_size: int | None = None) -> dict:
    """{guidance: quality.score.SetScore} from every rank's saved share; a missing share fails, naming it."""
    from sdperf.quality import fid
    from sdperf.quality.score import SetScore

    world_size = R.detect().world_size if world_size is None else R.detect(0, world_size).world_size
    folder = shard_dir(out_dir, name, world_size)
    scales = sorted(folder.glob("g*")) if folder.is_dir() else []
    if not scales:
        raise ConfigError(f"{str(folder)!r} holds no scores: run score_shard on every one of {world_size} rank(s) "
                          "first")
    out = {}
    for base in scales:
        paths = [base / f"rank-{r}.npz" for r in range(world_size)]
        clips = [base / f"rank-{r}-clip.csv" for r in range(world_size)]
        missing = [p.name for p in paths + clips if not p.is_file()]
        if missing:
            raise ConfigError(f"{str(base)!r} lacks {', '.join(missing)}: every rank of the {world_size}-rank "
                              "scoring must finish before the merge")
        stats = fid.merge([fid.load_stats(p) for p in paths])
        table = pd.concat([pd.read_csv(p, dtype={"key": str, "prompt_id": str}, keep_default_na=False) for p in clips])
        clip = table.sort_values(["prompt_id", "seed"])["clip"].to_numpy(dtype=float)  # the manifest's order
        out[float(base.name[1:])] = SetScore(stats, None if np.isnan(clip).all() else clip)
    return out


def score_folder(out_dir, scorers, name: str = "quality", rank: int | None = None, world_size: int | None = None,
                 manifest: pd.DataFrame | None = None) -> dict | None:
    """Score the folder split over the launched ranks; every rank returns the merged {guidance: SetScore}.
    Independent shards (explicit rank/world size, no rendezvous) return None: run merge_scores once all are done."""
    ranks = R.detect(rank, world_size)
    with R.process_group(ranks):
        score_shard(out_dir, scorers, name, ranks.rank, ranks.world_size, manifest)
        if len(R.gather(ranks, None)) != ranks.world_size:
            return None
        return merge_scores(out_dir, name, ranks.world_size)
