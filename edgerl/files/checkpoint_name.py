"""The names of checkpoint files, ``ckpt-<seq>-step<step>.ckpt``, apart from
:mod:`edgerl.files.checkpoint` so that what only lists checkpoints (``edgerl status``,
``edgerl serve``) does not import PyTorch."""

from __future__ import annotations

import re

NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-step(?P<step>\d+)\.ckpt$")
