"""How the page writes a measured number and its range over rounds: one rule for the findings and the headline.

'1.42x [1.41-1.46]', '8.33 s [7.74-10.18]'; a difference (no unit) is signed, its range comma-separated:
'-0.026 [-0.037, -0.017]', because '-0.037--0.017' hides which sign is which.
"""
from __future__ import annotations

import pandas as pd


def fixed(value, digits: int = 2) -> str:
    return f"{float(value):.{digits}f}"


def value_range(value, lo=None, hi=None, digits: int = 2, unit: str = "x") -> str:
    """`value` with `unit`, then its [lo-hi] range when both ends are known."""
    if unit == "":
        text = f"{float(value):+.{digits}f}"
        if pd.notna(lo) and pd.notna(hi):
            text += f" [{float(lo):+.{digits}f}, {float(hi):+.{digits}f}]"
        return text
    text = f"{fixed(value, digits)}{unit}"
    if pd.notna(lo) and pd.notna(hi):
        text += f" [{fixed(lo, digits)}-{fixed(hi, digits)}]"
    return text
