"""The PyTorch floor (versions.py): NVIDIA's pre-releases counted by their release, and a torch
too old said in one sentence at start-up."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("2.3.0a0+ebedce2.nv24.02", True),  # NVIDIA, JetPack 6.0: a pre-release of the floor
        ("2.4.0a0+07cecf4168.nv24.05", True),
        ("2.5.0a0+872d972e41.nv24.08", True),  # JetPack 6.1
        ("2.13.0+cpu", True),
        ("2.2.2", False),
        ("2.0.0.nv23.05", False),  # JetPack 5
        ("1.10.0", False),  # JetPack 4
        ("unknown", False),
    ],
)
def test_the_torch_floor_counts_nvidia_prereleases_by_their_release(version, ok):
    from edgerl.hw.versions import PlatformError, check_torch

    if ok:
        check_torch(version)
    else:
        with pytest.raises(PlatformError, match=r"needs PyTorch 2\.3 or newer .* this is "):
            check_torch(version)


def test_a_too_old_torch_is_one_sentence_at_start_up(cli, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.1.2+cu121")
    r = cli("train", "--env", "CartPole-v1", "--steps", "10")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("edgerl: error: edgerl needs PyTorch 2.3 or newer")
    assert "Traceback" not in r.err
