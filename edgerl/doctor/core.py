"""What every check shares: its result (:class:`Check`), what checks learn about the machine
(:class:`Context`), the report they add up to, and :func:`guarded`, which turns a check that
breaks into a ``fail`` line instead of ending the doctor."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from edgerl.errors import EdgerlError

if TYPE_CHECKING:
    import torch

    from edgerl.config import Config
    from edgerl.envs import EnvSpec
    from edgerl.hw.platform import Platform

log = logging.getLogger(__name__)

Status = Literal["pass", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip")
NAME_WIDTH = 20  # the longest check name (update/channels_last), so lines stay aligned


def one_line(text: str) -> str:
    """``text`` with its line breaks made spaces: a library's message may span lines (jtop's
    "... Please run:\nsudo jtop --install-service"), a check is one line of the table."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Check:
    """One finding: ``pass``, ``warn`` (works, with a limitation worth knowing), ``fail`` (this
    machine cannot do something edgerl is for) or ``skip`` (does not apply here).

    ``found`` says what was found, ``fix`` what to do about it (empty when nothing is to be
    done), ``data`` carries the same facts as plain values for ``--json`` readers.
    """

    name: str
    status: Status
    found: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The check as one line of the table: status, name, what was found, the fix."""
        fix = f"  fix: {one_line(self.fix)}" if self.fix else ""
        return f"{self.status:<4}  {self.name:<{NAME_WIDTH}}  {one_line(self.found)}{fix}"

    def to_dict(self) -> dict[str, Any]:
        """The check as a JSON object: name, status, found, fix and data."""
        return {
            "name": self.name,
            "status": self.status,
            "found": self.found,
            "fix": self.fix,
            "data": self.data,
        }


@dataclass
class Context:
    """What the checks learn as they go and later checks build on (config, platform, device,
    the game's spec). A value stays None when the check that finds it could not."""

    cfg: Config
    platform: Platform | None = None
    device: torch.device | None = None
    spec: EnvSpec | None = None
    torch_ok: bool = False  # torch is at least the supported floor
    is_root: bool = False


CheckFn = Callable[[Context], "Check | list[Check]"]


def guarded(name: str, fn: CheckFn, ctx: Context) -> list[Check]:
    """Run one check; a check that raises becomes a ``fail`` line, never a crash.

    An :class:`EdgerlError` already is the sentence a user should read; anything else is a
    bug in edgerl or in what it calls, kept in the debug log with its traceback.
    """
    try:
        result = fn(ctx)
    except EdgerlError as e:
        return [Check(name, "fail", str(e))]
    except Exception as e:
        log.debug("check %s raised", name, exc_info=True)
        return [
            Check(
                name,
                "fail",
                f"the check itself failed: {type(e).__name__}: {e}",
                "run `edgerl --debug doctor` for the traceback and report it",
            )
        ]
    return result if isinstance(result, list) else [result]


@dataclass
class Report:
    """All checks of one doctor run; nothing failed means exit code 0."""

    deep: bool
    checks: list[Check] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def add(self, checks: list[Check]) -> Iterator[Check]:
        """Keep ``checks`` and hand them on (so they can be printed as they come)."""
        for check in checks:
            self.checks.append(check)
            yield check

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0 when no check failed (warnings and skips allowed), 1 otherwise."""
        return 0 if self.ok else 1

    def summary(self) -> str:
        counts = self.counts()
        tally = ", ".join(f"{n} {s}" for s, n in counts.items())
        verdict = (
            "nothing failed"
            if self.ok
            else f"{counts['fail']} failed: fix the lines marked fail and run it again"
        )
        return f"edgerl doctor: {tally} in {time.monotonic() - self.started:.0f} s; {verdict}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``edgerl doctor --json``."""
        from edgerl import __version__

        return {
            "edgerl": __version__,
            "deep": self.deep,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "checks": [c.to_dict() for c in self.checks],
        }
