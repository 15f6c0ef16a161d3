"""What a run records and how it is read back: the results table (`results`, one row per notebook, scenario and
metric), a notebook's staged outputs that become current only when it completes (`staging`), each notebook's run
stamp and running marker (`stamps`), the captioned figures (`plots` draws and saves them, `figure_captions` is
the caption each carries), and the seal every cache entry carries and is checked against before use (`verified`).

May import: core/. Never run/ (a store is read by the report and written by the method, whoever runs them).
"""
