"""What the study is configured with, validated before any model is built: the profiles in params/ (`profiles`),
the SD 1.5 / SD 2-base / SDXL / tiny architectures (`architectures`), and the published figures (`published`).

May import: core/, store/.
"""
