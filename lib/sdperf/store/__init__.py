"""What a run records and how it is read back: the results table (`results`), a notebook's outputs staged until it
completes (`staging`), each notebook's run stamp and running marker (`stamps`), the captioned figures (`plots` draws
them, `figure_captions` is their caption), and the seal each cache entry is checked against (`verified`).

May import: core/. Never run/ (a store is read by the report and written by the method, whoever runs them).
"""
