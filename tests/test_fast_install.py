"""pip's configuration turned into uv's options (sdperf.tooling.fast_install): uv must install from exactly where pip
would, or fail so that make falls back to pip."""
from __future__ import annotations

import pytest

from sdperf.tooling import fast_install

# what `pip config list` printed on the study's machines (pip.conf plus PIP_* variables)
LISTING = """global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/local-wheels'
"""


def test_every_index_find_link_and_constraint_reaches_uv_and_the_environment_wins_over_the_file():
    args, env = fast_install.uv_options(fast_install.parse(LISTING))
    pairs = list(zip(args[3::2], args[4::2]))  # after the three fixed options
    assert ("--extra-index-url", "file:///opt/pypi/simple") in pairs
    assert ("--extra-index-url", "file:///opt/pypi-more/simple") in pairs
    assert ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    # PIP_FIND_LINKS replaces pip.conf's find-links, as pip reads them
    assert ("--find-links", "/opt/local-wheels") in pairs and ("--find-links", "/opt/wheels") not in pairs
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    # pip's resolution (best version over all indexes) and pip's bytecode, not uv's defaults
    assert args[:3] == ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]


def test_an_index_url_replaces_and_no_index_is_kept():
    args, _ = fast_install.uv_options(fast_install.parse(
        "global.index-url='https://a.example/simple'\n:env:.index-url='https://b.example/simple'\n"
        ":env:.no-index='true'\n"))
    assert args.count("--index-url") == 1 and args[args.index("--index-url") + 1] == "https://b.example/simple"
    assert "--no-index" in args


def test_an_option_it_cannot_translate_fails_naming_it_so_make_falls_back_to_pip():
    with pytest.raises(ValueError, match=r"'trusted-host'.*known: extra-index-url"):
        fast_install.uv_options(fast_install.parse("global.trusted-host='pypi.example'\n"))


def test_an_empty_configuration_gives_pips_defaults_only():
    assert fast_install.uv_options(fast_install.parse("")) == (
        ["--index-strategy", "unsafe-best-match", "--compile-bytecode"], {})
