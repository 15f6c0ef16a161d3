"""The one exception type users see for bad input; it always names the bad value and the valid choices."""


class ConfigError(ValueError):
    """A profile, parameter or path that cannot be used; raised before any model is built."""
