"""The two locks: a GPU machine installs requirements-gpu.lock over requirements.lock, so where both pin a package
they must pin the same version; and a lock line that is not an exact pin fails, naming the line."""
from __future__ import annotations

import pytest

from sdperf.core.errors import ConfigError
from sdperf.tooling.locks import PYPI_SIMPLE, disagreements, read_lock
from sdperf.core.paths import REPO_ROOT

MAIN = REPO_ROOT / "requirements.lock"
GPU = REPO_ROOT / "requirements-gpu.lock"


def test_committed_locks_agree_on_every_shared_package():
    main, gpu = read_lock(MAIN), read_lock(GPU)
    shared = main.pins.keys() & gpu.pins.keys()
    assert len(shared) >= 5, "the GPU lock pins onnxruntime-gpu's dependencies, which the main lock pins too"
    assert disagreements(main, gpu) == []


def test_gpu_lock_replaces_onnxruntime_with_the_gpu_build_of_the_same_release():
    main, gpu = read_lock(MAIN), read_lock(GPU)
    assert "onnxruntime" not in gpu.pins, "onnxruntime and onnxruntime-gpu must never be installed side by side"
    assert gpu.pins["onnxruntime-gpu"].version == main.pins["onnxruntime"].version
    assert {"tensorrt-cu13", "tensorrt-cu13-bindings", "tensorrt-cu13-libs"} <= gpu.pins.keys()
    assert len({gpu.pins[k].version for k in gpu.pins if k.startswith("tensorrt")}) == 1
    assert gpu.pins["tensorrt-cu13"].version.startswith("10."), "tensorrt_engine builds with BuilderFlag.FP16 (10.x)"
    assert gpu.index_urls[0] == PYPI_SIMPLE and "https://pypi.nvidia.com/" in gpu.index_urls


def _write(path, text):
    path.write_text(text)
    return read_lock(path)


def test_disagreements_name_each_package_pinned_differently(tmp_path):
    a = _write(tmp_path / "a.lock", "numpy==2.4.6\nFoo_Bar==1.0\nonly-a==3\nsame==1.0\n")
    b = _write(tmp_path / "b.lock", "# header\nsame==1.0.0\nfoo-bar==1.1\nnumpy==2.4.6\nonly-b==4\n")
    found = disagreements(a, b)
    assert found == ["Foo_Bar: a.lock line 2 pins 1.0, b.lock line 3 pins 1.1"]
    assert disagreements(b, a) == ["foo-bar: b.lock line 3 pins 1.1, a.lock line 2 pins 1.0"]
    assert disagreements(a, _write(tmp_path / "c.lock", "numpy==2.4.6\n")) == []


def test_lock_options_comments_and_extras_are_read(tmp_path):
    lock = _write(tmp_path / "x.lock", "--extra-index-url=https://example.org/simple\n"
                  "ort-gpu[cuda,cudnn]==1.2  # why\n"
                  "front==10.1  # sdist-ok: pure Python, source only\n")
    assert lock.index_urls == (PYPI_SIMPLE, "https://example.org/simple/")
    assert lock.pins["ort-gpu"].extras == ("cuda", "cudnn") and str(lock.pins["ort-gpu"]) == "ort-gpu[cuda,cudnn]==1.2"
    assert lock.pins["ort-gpu"].sdist_ok is None
    assert lock.pins["front"].sdist_ok == "pure Python, source only"
    assert _write(tmp_path / "y.lock", "--index-url https://mirror.example/simple/\na==1\n").index_urls == (
        "https://mirror.example/simple/",)


@pytest.mark.parametrize("line, message", [
    ("numpy>=2", "not an exact pin"),
    ("numpy==2.*", "not an exact pin"),
    ("numpy", "not an exact pin"),
    ("numpy==2 ; python_version<'3'", "not an exact pin"),
    ("numpy==two", "'numpy==two' is not a requirement"),
    ("-r other.lock", "option '-r other.lock' is not understood"),
    ("not a requirement!", "is not a requirement"),
])
def test_a_line_that_is_not_an_exact_pin_fails_naming_it(tmp_path, line, message):
    with pytest.raises(ConfigError, match="x.lock line 2") as exc:
        _write(tmp_path / "x.lock", f"a==1\n{line}\n")
    assert message in str(exc.value)


def test_a_package_pinned_twice_or_a_missing_file_fails(tmp_path):
    with pytest.raises(ConfigError, match="Numpy is pinned twice .also line 1."):
        _write(tmp_path / "x.lock", "numpy==1\nNumpy==1\n")
    with pytest.raises(ConfigError, match="'nope.lock' does not exist"):
        read_lock("nope.lock")
