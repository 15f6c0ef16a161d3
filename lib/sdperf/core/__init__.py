"""The floor every other part stands on: `errors`, where files live (`paths`), the record beside every number
(`environment`), known warnings filtered (`quiet`), sdperf/data's tables (`tables`), a lock refused at once (`held`).

May import: nothing of sdperf outside core/ (the standard library and the pinned libraries only).
"""
