"""sdperf.tooling.lock_check, offline: the indexes are fake pages (PEP 691 JSON and PEP 503 HTML) handed to the checker, so
these tests check the tag logic and the verdicts, not the network. `make check-gpu-lock` asks the real indexes."""
from __future__ import annotations

import json

import pytest
from packaging.tags import Tag

from sdperf.tooling import lock_check
from sdperf.cli import main
from sdperf.tooling.lock_check import IndexUnreachable, ProjectMissing, check_lock, summary, supported_tags
from sdperf.tooling.locks import read_lock

SHA = "ab" * 32
NVIDIA = "https://pypi.nvidia.com/"


def _json(*names, size=1_234_567):
    files = [{"filename": n, "url": f"https://files.example/{n}", "hashes": {"sha256": SHA}, "size": size}
             for n in names]
    return "application/vnd.pypi.simple.v1+json", json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()


def _html(*names):
    links = "".join(f'<a href="../../files/{n}#sha256={SHA}">{n}</a><br/>' for n in names)
    return "text/html", f"<html><body><h1>Links</h1>{links}</body></html>".encode()


def _fetcher(pages: dict):
    """url -> page; a missing url is a 404, an Exception value is raised (an index that does not answer)."""
    asked = []

    def get(url):
        asked.append(url)
        page = pages.get(url)
        if page is None:
            raise ProjectMissing(f"{url} answered 404")
        if isinstance(page, Exception):
            raise page
        return page

    get.asked = asked
    return get


def _lock(tmp_path, text):
    path = tmp_path / "gpu.lock"
    path.write_text(text)
    return read_lock(path)


def test_supported_tags_are_cpython_311_linux_x86_64_up_to_the_glibc():
    got = set(supported_tags(glibc=(2, 28)))
    for ok in ("cp311-cp311-manylinux_2_28_x86_64", "cp311-abi3-manylinux2014_x86_64",
               "cp310-abi3-manylinux_2_17_x86_64", "cp311-none-manylinux_2_28_x86_64", "py3-none-manylinux1_x86_64",
               "py3-none-any", "py311-none-any"):
        assert Tag(*ok.split("-")) in got, ok
    for bad in ("cp312-cp312-manylinux_2_28_x86_64", "cp311-cp311-manylinux_2_34_x86_64",
                "cp311-cp311-manylinux_2_28_aarch64", "cp311-cp311-win_amd64", "cp311-cp311-linux_x86_64",
                "cp311-cp311-musllinux_1_2_x86_64", "cp312-abi3-manylinux_2_28_x86_64"):
        assert Tag(*bad.split("-")) not in got, bad
    assert Tag("cp311", "cp311", "manylinux_2_34_x86_64") in set(supported_tags(glibc=(2, 35)))


def test_each_pin_is_judged_on_its_own_release_and_the_target_tags(tmp_path):
    lock = _lock(tmp_path, "good==1.0\nwrongplatform==2.0\nother-version==3.0\nsource-only==4.0\n")
    get = _fetcher({
        "https://pypi.org/simple/good/": _json("good-1.0-cp311-abi3-manylinux2014_x86_64.whl",
                                               "good-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                                               "good-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", "good-1.0.tar.gz"),
        "https://pypi.org/simple/wrongplatform/": _json("wrongplatform-2.0-cp312-cp312-manylinux_2_28_x86_64.whl",
                                                        "wrongplatform-2.0-cp311-cp311-manylinux_2_34_x86_64.whl",
                                                        "wrongplatform-2.0-cp311-cp311-win_amd64.whl"),
        "https://pypi.org/simple/other-version/": _json("other_version-3.0.1-py3-none-any.whl"),
        "https://pypi.org/simple/source-only/": _json("source_only-4.0.tar.gz"),
    })
    good, wrong, other, source = check_lock(lock, get)
    assert good.ok and good.file.filename == "good-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"  # the most specific
    assert "1.2 MB" in good.detail and SHA in good.detail and good.index == "pypi.org"
    assert not wrong.ok and "no CPython 3.11 manylinux_2_28_x86_64 wheel among" in wrong.detail
    assert "wrongplatform-2.0-cp311-cp311-manylinux_2_34_x86_64.whl" in wrong.detail
    assert not other.ok and "pypi.org: no files for 3.0" in other.detail
    assert not source.ok and "source_only-4.0.tar.gz" in source.detail
    text = summary(lock, [good, wrong, other, source])
    assert text.splitlines()[-1] == ("1 of 4 pins have an installable file; no wheel shown for: wrongplatform==2.0, "
                                     "other-version==3.0, source-only==4.0")
    assert [line.split()[0] for line in text.splitlines()[1:-1]] == ["ok", "FAILED", "FAILED", "FAILED"]


def test_a_later_index_in_html_supplies_the_wheel_and_an_unreachable_one_is_unverified(tmp_path):
    lock = _lock(tmp_path, f"--extra-index-url {NVIDIA}\nlibs==10.16\nfront==10.16  # sdist-ok: pure Python\n"
                           "missing==1\n")
    pages = {"https://pypi.org/simple/libs/": _json("libs-10.16.tar.gz"),
             f"{NVIDIA}libs/": _html("libs-10.16-py3-none-manylinux_2_28_x86_64.whl"),
             "https://pypi.org/simple/front/": _json("front-10.16.tar.gz", size=17_916)}
    libs, front, missing = check_lock(lock, _fetcher(pages))
    assert libs.ok and libs.index == "pypi.nvidia.com"
    assert libs.file.url == "https://pypi.nvidia.com/files/libs-10.16-py3-none-manylinux_2_28_x86_64.whl"
    assert libs.file.sha256 == SHA and libs.file.size is None and "size not given by the index" in libs.detail
    assert front.ok and "front-10.16.tar.gz  17.9 kB" in front.detail and "source only" in front.detail
    assert not missing.ok and missing.detail == "pypi.org: no project missing; pypi.nvidia.com: no project missing"
    assert not missing.unverified and lock_check.exit_code([libs, front, missing]) == 1
    assert lock_check.exit_code([libs, front]) == 0

    pages[f"{NVIDIA}libs/"] = IndexUnreachable("pypi.nvidia.com could not be reached (Name or service not known)")
    libs, front, missing = check_lock(lock, _fetcher(pages))
    assert lock_check.exit_code([libs, front]) == 3 and lock_check.exit_code([libs, front, missing]) == 1
    assert "libs==10.16 (unverified: an index did not answer)" in summary(lock, [libs, front])
    assert not libs.ok and libs.unverified and "pypi.nvidia.com: unreachable from here, unverified" in libs.detail
    assert "pypi.org: no CPython 3.11 manylinux_2_28_x86_64 wheel among libs-10.16.tar.gz" in libs.detail
    assert front.ok  # the source release is allowed by its line, and pypi.org has it


def test_sdist_ok_does_not_excuse_a_release_with_no_files(tmp_path):
    lock = _lock(tmp_path, "front==10.16  # sdist-ok: pure Python\n")
    (result,) = check_lock(lock, _fetcher({"https://pypi.org/simple/front/": _json("front-10.15.tar.gz")}))
    assert not result.ok and "no files for 10.16" in result.detail


def test_each_index_page_is_fetched_once(tmp_path):
    lock = _lock(tmp_path, "a==1\nb==1\n")
    get = _fetcher({})
    check_lock(lock, get)
    assert get.asked == ["https://pypi.org/simple/a/", "https://pypi.org/simple/b/"]


def test_cli_exit_code_follows_the_verdict(tmp_path, monkeypatch, capsys):
    path = tmp_path / "gpu.lock"
    path.write_text("good==1.0\n")
    pages = {"https://pypi.org/simple/good/": _json("good-1.0-py3-none-any.whl")}
    monkeypatch.setattr(lock_check, "fetch", _fetcher(pages))
    assert main(["check-lock", str(path)]) == 0
    assert "1 of 1 pins have an installable file" in capsys.readouterr().out
    pages.clear()
    assert main(["check-lock", str(path)]) == 1
    assert "FAILED  good==1.0  pypi.org: no project good" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["check-lock", "nope.lock"], "lock file 'nope.lock' does not exist"),
    (["check-lock", "requirements-gpu.lock", "--glibc", "3.1"], "--glibc '3.1' is not valid"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
