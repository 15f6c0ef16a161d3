"""The one exception type users see for bad input; it always names the bad value and the valid choices."""
from __future__ import annotations

import reprlib


class ConfigError(ValueError):
    """A profile, parameter or path that cannot be used; raised before any model is built."""


MAX_SHOWN = 200  # characters of a value an error message shows


def _shortener() -> reprlib.Repr:
    """reprlib elides while it formats, so a huge or deeply nested value costs only what is shown."""
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 6, 8, 8, 8
    r.maxstring, r.maxother, r.maxlong = 120, 120, 60
    return r


_SHORT = _shortener()


def short(value, limit: int = MAX_SHOWN) -> str:
    """repr(value) for an error message, bounded in time and length: a bad value is named, never dumped whole."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
