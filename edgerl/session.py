"""A training session: the Trainer inside the hardware around it (max clocks, load monitor).

``edgerl train`` and the service both train through :func:`training_session`, so clocks are
restored and the monitor stopped on every exit path, in reverse order of setting up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from edgerl.config import Config
from edgerl.hw.clocks import MaxClocks, state_dir_for
from edgerl.hw.monitor import LoadMonitor
from edgerl.status import StatusWriter
from edgerl.train import Hook, Trainer


@contextlib.contextmanager
def training_session(
    cfg: Config, *, fresh: bool = False, quiet: bool = False, hooks: Sequence[Hook] = ()
) -> Iterator[Trainer]:
    """Yield a ready Trainer with clocks maxed (``hw.max_clocks``) and the monitor running.

    Every run keeps ``<run_dir>/status.json`` current (``stopped`` or ``failed`` at the end).
    Raises what :class:`Trainer` raises for user errors, before touching the clocks.
    """
    status = StatusWriter()
    trainer = Trainer(cfg, fresh=fresh, quiet=quiet, hooks=[status, *hooks])
    with trainer, _final_status(trainer, status), contextlib.ExitStack() as stack:
        hw = trainer.cfg.hw
        if hw.max_clocks:
            trainer.clocks = stack.enter_context(MaxClocks(hw, state_dir_for(hw)))
        if hw.monitor:
            monitor = LoadMonitor(hw, trainer.run_dir, step=lambda: trainer.step)
            trainer.monitor = stack.enter_context(monitor)
            trainer.hooks.insert(0, monitor)  # first, so later hooks see the newest load
        yield trainer


@contextlib.contextmanager
def _final_status(trainer: Trainer, status: StatusWriter) -> Iterator[None]:
    """Write the last status.json: failed (with the error) or stopped."""
    try:
        yield
    except BaseException as e:
        with contextlib.suppress(Exception):
            status.finish(trainer, "failed", f"{type(e).__name__}: {e}")
        raise
    with contextlib.suppress(Exception):
        status.finish(trainer, "stopped")
