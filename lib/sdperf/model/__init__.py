"""Building and running the model that is measured: the offline CLIP tokenizer (`tokenizer`), the caption files
(`prompts`), the pipeline of a profile (`pipelines`), and the denoising loop, stage by stage (`generation`).

May import: config/, store/, core/ (and the reference model's weights manifest, sdperf.refmodel.manifest).
"""
