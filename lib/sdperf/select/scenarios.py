"""The names of 10's rows that the report looks up: ladder rungs, best recipe, chosen stacks, search candidates.
The words live here, once, below writer and reader, so a change on one side cannot silently empty a table."""
from __future__ import annotations

import pandas as pd

CEREBRIUM_LADDER = "Cerebrium order"  # the seed's rungs, in its order
BEST_LADDER = "best order here"  # the same rungs in the order that is best on this machine
LADDERS = (CEREBRIUM_LADDER, BEST_LADDER)
BEST_RECIPE = "best recipe"
BEST_STACK, LOSSLESS_STACK = "best admissible stack", "best lossless stack"
HEADLINES = (BEST_STACK, LOSSLESS_STACK)
SEARCH = "stack search"


def named(kind: str, what: str) -> str:
    """The scenario of a row of `kind` about `what`: 'best lossless stack: compile:freezing+stages:openvino-f32'."""
    return f"{kind}: {what}"


def rung(ladder: str, index: int, label: str) -> str:
    """Rung `index` of a ladder: 'best order here 2: allocator tcmalloc'."""
    return f"{ladder} {index}: {label}"


def of_kind(rows: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    """The rows named by `named(kind, ...)` for any of `kinds`."""
    if rows.empty:
        return rows
    return rows[rows["scenario"].astype(str).str.startswith(tuple(f"{k}: " for k in kinds))]


def subject(scenario: str, kind: str) -> str:
    """What a row of `kind` is about: the inverse of named()."""
    return str(scenario).removeprefix(f"{kind}: ")


def rungs(rows: pd.DataFrame) -> pd.DataFrame:
    """Every ladder rung's rows and the best recipe's."""
    if rows.empty:
        return rows
    starts = tuple(f"{lad} " for lad in LADDERS) + (f"{BEST_RECIPE}: ",)
    return rows[rows["scenario"].astype(str).str.startswith(starts)]
