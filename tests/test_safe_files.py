"""Files a user hands the study are read without running their code, and files the study writes follow the umask."""
from __future__ import annotations

import os
import stat

import pytest
import torch

from sdperf.core import paths
from sdperf.core.errors import ConfigError
from sdperf.quality import fid
from sdperf.store.results import atomic_write_text


class _Payload:
    """Unpickling this runs Path.touch(marker): what a crafted weights file could do with os.system instead."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def test_a_crafted_pickle_as_inception_weights_is_refused_without_running(tmp_path):
    marker, crafted = tmp_path / "payload-ran", tmp_path / "inception.pth"
    torch.save({"conv.weight": torch.zeros(1), "evil": _Payload(marker)}, crafted)
    with pytest.raises(ConfigError) as err:
        fid.inception(crafted, num_features=64)
    assert not marker.exists(), "the file's code ran"
    assert str(crafted) in str(err.value) and "weights_only=True" in str(err.value)


def test_a_non_tensor_state_is_refused_and_real_weights_load(tmp_path):
    listed = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(ConfigError, match="not a state dict of tensors"):
        fid.inception(listed, num_features=64)
    good = tmp_path / "good.pth"  # a plain state dict, as torch-fidelity's published file is
    torch.save(fid.random_inception_state(3), good)
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fid.features(fid.inception(good, num_features=64), images),
                       fid.features(fid.inception(None, num_features=64, seed=3), images))


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        assert paths.current_umask() == umask
        atomic_write_text(tmp_path / "results.csv", "a,b\n")
        fd, tmp = paths.sibling_tempfile(tmp_path / "page.html")
        os.close(fd)
    finally:
        os.umask(old)
    for f in (tmp_path / "results.csv", tmp):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o666 & ~umask
