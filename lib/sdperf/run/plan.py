"""What a run will do, decided before anything runs: which notebooks, with which parameters from the profile's
`notebooks:` section, and whether its other sections are valid; the runner and sdperf.run.prefetch both read it.
"""
from __future__ import annotations

from pathlib import Path

from sdperf.config.profiles import Profile
from sdperf.core import paths
from sdperf.core.errors import ConfigError, short


def check_sections(profile: Profile) -> None:
    """The training, quality and serving sections, each validated by its package, before the first notebook."""
    from sdperf.quality.quality_settings import settings as quality
    from sdperf.serving.serving_settings import load as serving
    from sdperf.training.training_settings import from_profile as training

    for check in (training, quality, serving):
        check(profile)
    check_techniques(profile)


def check_techniques(profile: Profile) -> None:
    from sdperf.optimizations import catalog

    for key in profile.techniques:
        try:
            catalog.Stack.of(key)
        except ConfigError as exc:
            raise ConfigError(f"profile {profile.name!r}: techniques: {exc}") from None


def notebook_names(notebooks_dir: Path | None = None) -> list[str]:
    folder = Path(notebooks_dir or paths.notebooks_dir())
    return sorted(p.stem for p in folder.glob("*.ipynb"))


def _matches(token: str, name: str) -> bool:
    """'00_baseline' is also reachable as '00' and as 'baseline', which is what people type."""
    number, _, rest = name.partition("_")
    return token in (name, number, rest)


def select(only: list[str] | None, names: list[str]) -> list[str]:
    """The notebooks to run, in study order; any unknown or ambiguous name fails before anything runs."""
    if not only:
        return list(names)
    chosen: set[str] = set()
    for token in only:
        hits = [n for n in names if _matches(token, n)]
        if not hits:
            raise ConfigError(f"unknown notebook {token!r}; valid notebooks: {', '.join(names) or '(none found)'}")
        if len(hits) > 1:
            raise ConfigError(f"notebook name {token!r} is ambiguous: it matches {', '.join(hits)}")
        chosen.add(hits[0])
    return [n for n in names if n in chosen]


def check_notebook_parameters(profile: Profile, selected: list[str], notebooks_dir: Path | None = None) -> None:
    """The profile's `notebooks:` section names study notebooks and parameters their `parameters` cell declares."""
    known = notebook_names()
    for name, params in profile.notebooks.items():
        if name not in known:
            raise ConfigError(f"profile {profile.name!r}: notebooks: unknown notebook {name!r}; valid notebooks: "
                              f"{', '.join(known)}")
        if not isinstance(params, dict):
            raise ConfigError(f"profile {profile.name!r}: notebooks: {name} must be a mapping of parameter: value, "
                              f"got {params!r}")
        path = Path(notebooks_dir or paths.notebooks_dir()) / f"{name}.ipynb"
        if name not in selected or not path.is_file():
            continue
        import papermill

        declared = papermill.inspect_notebook(str(path))
        for key, value in params.items():
            if key == "profile" or key not in declared:
                valid = [d for d in sorted(declared) if d != "profile"]
                raise ConfigError(f"profile {profile.name!r}: notebooks: {name} has no parameter {short(key)}; valid "
                                  f"parameters: {', '.join(valid) or '(none)'}")
            check_parameter_type(f"profile {profile.name!r}: notebooks: {name}: {key}", value,
                                 declared[key].get("inferred_type_name"))
            check_catalog_keys(f"profile {profile.name!r}: notebooks: {name}: {key}", value, declared[key])


def _catalog_prefixes() -> set[str]:
    """What a catalog key begins with: each declared key's family prefix and each parametric prefix."""
    from sdperf.optimizations import catalog

    return {k.partition(":")[0] for k in catalog.keys()} | set(catalog._prefixes())


def _is_key(text: str) -> bool:
    from sdperf.optimizations import catalog

    try:
        catalog.Stack.of(text)
    except ConfigError:
        return False
    return True


def check_catalog_keys(where: str, value, declared: dict) -> None:
    """A key-valued parameter's keys (by default, help or catalog prefix), checked against the catalog."""
    import ast

    from sdperf.optimizations import catalog

    values = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
    try:
        default = ast.literal_eval(declared.get("default") or "None")
    except (ValueError, SyntaxError):
        default = None
    defaults = [default] if isinstance(default, str) else default if isinstance(default, list) else []
    holds_keys = (bool(defaults) and all(isinstance(d, str) and _is_key(d) for d in defaults)) \
        or "catalog" in (declared.get("help") or "")
    prefixes = _catalog_prefixes()
    for v in values:
        if not isinstance(v, str):
            continue
        first = v.split(catalog.STACK_SEP)[0].partition(":")
        if holds_keys or (first[1] and first[0] in prefixes):
            try:
                catalog.Stack.of(v)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None


_SCALARS = (str, int, float, bool)  # a list's items: papermill writes every value as Python source
MAX_LIST_ITEMS = 1000
MAX_TEXT = 10_000


def check_parameter_type(where: str, value, annotation: str | None) -> None:
    """A profile's value for a notebook parameter has the type the parameters cell annotates (`name: list = ...`)."""
    kinds = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "list": (list,)}
    expected = kinds.get(annotation or "")
    if expected is None:  # unannotated (papermill says "None"): a scalar or a list, as the notebooks' values are
        annotation, expected = "a str, int, float, bool or list", _SCALARS + (list,)
    wrong_bool = isinstance(value, bool) and bool not in expected
    if wrong_bool or not isinstance(value, expected):
        raise ConfigError(f"{where} must be {annotation} (its annotation in the notebook's parameters cell), got "
                          f"{type(value).__name__} {short(value)}")
    if isinstance(value, list):
        if len(value) > MAX_LIST_ITEMS or not all(isinstance(v, _SCALARS) for v in value):
            raise ConfigError(f"{where} must be a list of at most {MAX_LIST_ITEMS} strings or numbers, got "
                              f"{short(value)}")
    texts = value if isinstance(value, list) else [value]
    if any(isinstance(t, str) and len(t) > MAX_TEXT for t in texts):
        raise ConfigError(f"{where}: a string over {MAX_TEXT:,} characters is not a setting, got {short(value)}")


def notebook_parameters(profile: Profile, name: str) -> dict:
    return {"profile": profile.name, **profile.notebooks.get(name, {})}
