"""Errors a user can cause.

Every error a user can fix is an :class:`EdgerlError` whose message is one sentence saying what is
wrong and what to change. The CLI prints that sentence and exits with :attr:`EdgerlError.exit_code`
(2) without a traceback; anything else is a bug and keeps its traceback under ``--debug``.
"""

from __future__ import annotations


class EdgerlError(Exception):
    """A problem the user can fix; ``str(error)`` is the sentence shown to them."""

    exit_code = 2


class ConfigError(EdgerlError):
    """A config file, ``--set`` override or flag is invalid."""


class EnvError(EdgerlError):
    """An environment id is unknown or unusable for DQN."""


class ReplayMemoryError(EdgerlError):
    """The replay buffer would not fit in available memory."""


class EnvMemoryError(EdgerlError):
    """``env.num_envs`` environments would not fit in available host memory."""


class CheckpointError(EdgerlError):
    """A checkpoint is missing, corrupt, incompatible or cannot be written."""


class RunDirError(EdgerlError):
    """The run directory cannot be used (not writable, in use, incompatible)."""


class DeviceError(EdgerlError):
    """The requested compute device (e.g. CUDA) is not usable here."""


class HardwareError(EdgerlError):
    """A hardware action cannot be done here (not a Jetson, not root, tool missing or failing)."""


class MissingDependencyError(EdgerlError):
    """An optional package (an extra) is needed for this command."""

    def __init__(self, package: str, extra: str, purpose: str, instead: str = "") -> None:
        install = (
            f"pip install 'edgerl[{extra}]' (in a clone of edgerl: pip install -e '.[{extra}]')"
        )
        if instead:  # a way that needs no package comes first
            said = f"{instead}, or install it with: {install}"
        else:
            said = f"install it with: {install}"
        super().__init__(
            f"{purpose} needs the Python package '{package}', which is not installed; {said}"
        )
        self.package = package
        self.extra = extra


class PackagedDataError(EdgerlError):
    """A table edgerl ships (edgerl/data/) is damaged: the install is broken, not the command."""

    exit_code = 1


class OutputError(EdgerlError):
    """A file a command was asked to write (a plot, a recording) cannot be written."""


class FleetError(EdgerlError):
    """Remote actors cannot run: the Ray cluster cannot be reached or joined, or no actor can
    start on it."""


class ServeError(EdgerlError):
    """``edgerl serve`` cannot listen where it was asked to (port taken, no such address)."""
