"""The floor every other part stands on: errors (`ConfigError` and friends), where files live (`paths`), the
environment record stored beside every number (`environment`), and the pinned libraries' known warnings filtered
once at `import sdperf` (`quiet`), the study's transcribed tables in sdperf/data read by name (`tables`), and a lock
a second holder is refused at once (`held`).

May import: nothing of sdperf outside core/ (the standard library and the pinned libraries only).
"""
