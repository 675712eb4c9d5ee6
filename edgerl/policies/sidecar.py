"""What a policy file says about itself: the names of its input and outputs, and its sidecar
(``<file>.json``, also inside an ONNX file): the game it plays, how it was made, how well it
agreed with PyTorch. Written by :mod:`edgerl.export`, read by every backend here."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgerl import __version__
from edgerl.errors import EdgerlError
from edgerl.files.regular import read_regular

INPUT = "obs"


OUTPUTS = ("q_values", "action")


SIDECAR_FORMAT = "edgerl-policy"


class ExportError(EdgerlError):
    """An export could not be made, or does not agree with PyTorch."""


@dataclass
class Sidecar:
    """What a policy file is for; stored as ``<file>.json`` (and inside an ONNX file)."""

    env_id: str
    kind: str
    obs_shape: list[int]
    obs_dtype: str
    action_meanings: list[str]
    env_config: dict[str, Any]
    source_checkpoint: str
    source_sha256: str
    step: int
    precision: str = "fp32"
    batch_max: int = 1
    backend: str = "onnx"
    onnx_opset: int | None = None
    tensorrt_version: str | None = None
    gpu: str | None = None
    built_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    edgerl_version: str = __version__
    agreement: dict[str, Any] = field(default_factory=dict)
    latency_us: dict[str, float] = field(default_factory=dict)
    format: str = SIDECAR_FORMAT
    # A continuous game's action: its shape and bounds (empty: a discrete game's, as in every
    # file written before continuous actions; the graph's ``action`` output is then float32).
    action_shape: list[int] = field(default_factory=list)
    action_low: list[float] = field(default_factory=list)
    action_high: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def env_spec(self) -> Any:
        """The EnvSpec of the game this policy plays."""
        from edgerl.envs import EnvSpec

        d = {
            "id": self.env_id,
            "kind": self.kind,
            "obs_shape": self.obs_shape,
            "obs_dtype": self.obs_dtype,
            "num_actions": len(self.action_meanings),
            "action_meanings": self.action_meanings,
            "action_shape": self.action_shape,
            "action_low": self.action_low,
            "action_high": self.action_high,
        }
        try:
            return EnvSpec.from_dict(d)
        except (TypeError, ValueError) as e:
            raise ExportError(f"its game's description is no game's: {e}") from None

    @classmethod
    def of(cls, spec: Any, **fields: Any) -> Sidecar:
        """The description of a policy for ``spec``'s game (an EnvSpec), with ``fields``."""
        return cls(
            env_id=spec.id,
            kind=spec.kind,
            obs_shape=list(spec.obs_shape),
            obs_dtype=spec.obs_dtype,
            action_meanings=list(spec.action_meanings),
            action_shape=list(spec.action_shape),
            action_low=list(spec.action_low),
            action_high=list(spec.action_high),
            **fields,
        )

    @classmethod
    def from_dict(cls, d: Any, source: str) -> Sidecar:
        """The sidecar a JSON document describes; raises ExportError (one sentence) when it is
        none, or its fields have the wrong types (the file may be damaged)."""
        if not isinstance(d, dict) or d.get("format") != SIDECAR_FORMAT:
            raise ExportError(f"{source} is not an edgerl policy description")
        for name, kind in SIDECAR_TYPES.items():
            value = d.get(name)
            if name in d and (isinstance(value, bool) or not isinstance(value, kind)):
                raise ExportError(f"{source} is damaged: {name} is {repr(value)[:40]}")
        shape, meanings = d.get("obs_shape", []), d.get("action_meanings", [])
        if not all(isinstance(n, int) and 0 < n <= 1 << 16 for n in shape) or not all(
            isinstance(a, str) for a in meanings
        ):
            raise ExportError(f"{source} is damaged: its observation shape or actions")
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        try:
            sidecar = cls(**known)
        except TypeError as e:
            raise ExportError(f"{source} is incomplete: {e}") from None
        try:
            sidecar.env_spec()  # what play and export build from it
        except ExportError as e:
            raise ExportError(f"{source} is damaged: {e}") from None
        return sidecar

    @classmethod
    def read(cls, policy_file: Path) -> Sidecar:
        """The sidecar ``<file>.json`` of a policy file; raises ExportError when missing."""
        path = sidecar_path(policy_file)
        try:
            return cls.from_dict(json.loads(read_regular(path, MAX_SIDECAR_BYTES)), str(path))
        except FileNotFoundError:
            raise ExportError(
                f"{path} is missing: it says which game {policy_file.name} plays; export again "
                "with edgerl export"
            ) from None
        except (ValueError, RecursionError) as e:
            raise ExportError(f"{path} is not valid JSON: {e}") from None
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or e}") from None


MAX_SIDECAR_BYTES = 1 << 20  # a sidecar is about 1 KiB


# The types of the fields a policy's use reads (a sidecar may be damaged).
SIDECAR_TYPES: dict[str, type | tuple[type, ...]] = {
    "env_id": str,
    "kind": str,
    "obs_shape": list,
    "obs_dtype": str,
    "action_meanings": list,
    "env_config": dict,
    "step": int,
    "batch_max": int,
    "precision": str,
    "action_shape": list,
    "action_low": list,
    "action_high": list,
}


def sidecar_path(policy_file: Path) -> Path:
    return policy_file.with_name(policy_file.name + ".json")


def check_batch(n: int, batch_max: int | None) -> None:
    """Raise EdgerlError when a batch of ``n`` is more than a policy file accepts."""
    if batch_max is not None and n > batch_max:
        raise EdgerlError(f"this engine takes batches of at most {batch_max}, not {n}")
