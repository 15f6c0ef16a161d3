"""Sharded, resumable image generation for evaluation at scale (NeMo's 30,000 images per guidance scale).

    summary = generate_folder("smoke", prompts.smoke_captions(), "out/", guidance_scales=[1.5, 7.5])
    table = read_manifest("out/")          # one row per image: prompt id, caption, guidance, seed, file, ...

Under torchrun each process generates its share (`sdperf generate` from the shell). Modules: `keys` (an image and
its rank), `ranks` (who this process is), `render` (a batch through the loop), `store` (the folder), `folder` (a run).
"""
from sdperf.imagegen.folder import RankStats, Summary, generate_folder, plan
from sdperf.imagegen.keys import NEMO_GUIDANCE, ImageKey, plan_keys, shard, work_units
from sdperf.imagegen.store import read_manifest, rebuild_manifest

__all__ = ["NEMO_GUIDANCE", "ImageKey", "RankStats", "Summary", "generate_folder", "plan", "plan_keys",
           "read_manifest", "rebuild_manifest", "shard", "work_units"]
