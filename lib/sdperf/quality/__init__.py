"""Image quality at every setting the study measures: FID-vs-CLIP curves over guidance scales (the NeMo protocol),
the MLPerf SDXL gate, and FID/CLIP of each optimization rung against the fp32 baseline's images.

Modules: quality_settings (the profile's quality section), images (generated-image folders), fid (Inception features
and mergeable statistics), clip (CLIP score), score (scoring image sets), sharded (scores merged across ranks), curve /
rungs / gate (what 12_fid_clip shows, called through sdperf.experiments.fid_clip).
"""
