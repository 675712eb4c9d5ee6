"""The oldest PyTorch edgerl supports, and reading the version strings NVIDIA's builds carry.

The floor is the PyTorch NVIDIA ships for JetPack 6.0 (2.3, Python 3.10). NVIDIA's Jetson builds
are pre-releases with a local tag (``2.3.0a0+ebedce2.nv24.02``), which PEP 440 orders *before*
2.3.0, so versions are compared by their release numbers only. The "Supported platforms"
table of docs/install.md says which JetPack and desktop releases this covers.
"""

from __future__ import annotations

import re

from edgerl.errors import EdgerlError

TORCH_FLOOR = (2, 3)
RELEASE = re.compile(r"^\s*v?(?P<release>\d+(?:\.\d+)*)")


class PlatformError(EdgerlError):
    """This machine's PyTorch (or TensorRT) is older than edgerl supports."""


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: ``2.3.0a0+ebedce2.nv24.02`` -> (2, 3, 0).

    Returns () when the string does not start with a number.
    """
    m = RELEASE.match(version)
    return tuple(int(p) for p in m["release"].split(".")) if m else ()


def torch_supported(version: str) -> bool:
    """Whether a torch version string is at least :data:`TORCH_FLOOR` (unreadable: False)."""
    numbers = release(version)
    return bool(numbers) and numbers[:2] >= TORCH_FLOOR


def check_torch(version: str | None = None) -> None:
    """Raise PlatformError, one sentence with the fix, if torch (installed, or ``version``) is
    older than the floor."""
    if version is None:
        import torch

        version = torch.__version__
    if torch_supported(version):
        return
    floor = ".".join(map(str, TORCH_FLOOR))
    raise PlatformError(
        f"edgerl needs PyTorch {floor} or newer (the one NVIDIA ships for JetPack 6.0) and this "
        f"is {version}; on a Jetson install NVIDIA's PyTorch wheel for your JetPack, elsewhere "
        f"pip install 'torch>={floor}' (see Supported platforms in docs/install.md)"
    )
