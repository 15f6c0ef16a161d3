"""Install requirements.lock with uv, reading pip's own configuration, so that pip and uv install from the same places.

`pip config list` is turned into uv's options; an unknown one is named and fails (`make` then falls back to pip).
Standalone: it runs before sdperf is installed (python lib/sdperf/tooling/fast_install.py VENV_PYTHON LOCK).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

# pip option -> uv option, each value of a space-separated list passed once
LISTS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}
SINGLE = {"index-url": "--index-url"}
# pip options with no bearing on which files are installed
IGNORED = ("default-timeout", "disable-pip-version-check", "timeout", "progress-bar", "no-color", "quiet",
           "verbose", "retries", "no-input", "root-user-action", "cache-dir", "no-cache-dir")


def parse(listing: str) -> dict[str, list[str]]:
    """`pip config list` output -> {option: values}; an environment variable's (`:env:.`) overrides a file's."""
    files, env = {}, {}
    for line in listing.splitlines():
        if "=" not in line:
            continue
        name, _, value = line.partition("=")
        option = name.rsplit(".", 1)[-1]
        values = shlex.split(value)
        values = values[0].split() if len(values) == 1 else values
        (env if name.startswith(":env:") else files)[option] = values
    return {**files, **env}


def uv_options(config: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """(uv pip install options, environment additions); ValueError naming an option it does not translate."""
    args, env = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"], {}
    for option, values in config.items():
        if option in LISTS:
            for v in values:
                args += [LISTS[option], v]
        elif option in SINGLE:
            args += [SINGLE[option], values[-1]]
        elif option == "cert":
            env["SSL_CERT_FILE"] = values[-1]
        elif option == "no-index":
            if values and values[-1].lower() in ("1", "true", "yes", "on"):
                args.append("--no-index")
        elif option not in IGNORED:
            raise ValueError(f"pip option {option!r} has no uv translation here; known: "
                             f"{', '.join([*LISTS, *SINGLE, 'cert', 'no-index', *IGNORED])}")
    return args, env


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: fast_install.py VENV_PYTHON REQUIREMENTS", file=sys.stderr)
        return 2
    python, lock = argv[1], argv[2]
    listing = subprocess.run([python, "-m", "pip", "config", "list"], check=True, capture_output=True,
                             text=True).stdout
    try:
        args, env = uv_options(parse(listing))
    except ValueError as exc:
        print(f"fast_install: {exc}", file=sys.stderr)
        return 1
    uv = [python, "-m", "uv", "pip", "install", "--quiet", "--python", python, *args, "-r", lock]
    return subprocess.run(uv, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
