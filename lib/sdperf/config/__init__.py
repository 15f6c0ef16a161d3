"""What the study is configured with, validated before any model is built: the profiles in params/ (`profiles`),
the SD 1.5 / SD 2-base / SDXL / tiny architectures (`architectures`), and the published figures it compares with
(`published`: one table, sdperf/data/published.csv, and the views its readers take).

May import: core/, store/.
"""
