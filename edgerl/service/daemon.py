"""The service: the Trainer plus systemd's protocol (``edgerl daemon``, run by edgerl.service).

Start-up, in this order: the signal handlers (a stop or a reload is heard from the first
moment), read ``/etc/edgerl/edgerl.toml`` (or ``--config``) and say what it will do (started by
hand: that it is not under systemd), max the clocks (``hw.max_clocks`` defaults to true here),
measure the machine where its config chooses no learner (:mod:`edgerl.run.calibrate`: at the
first start, with ``STATUS=`` naming each measurement), so that it is measured at the clocks it
trains at, then the recipe; resume the run directory (default ``$STATE_DIRECTORY/runs/<env>``,
i.e. ``/var/lib/edgerl/runs/Pong-v5``), start the load monitor, take the first environment step,
and only then send ``READY=1``. A stop before that ends the start within seconds, said in the
log, clocks restored. While training, from the training loop itself: ``STATUS=`` every few
seconds and ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC``, so systemd restarts a hung loop.

SIGTERM/SIGINT: ``STOPPING=1``, finish the step, write a checkpoint, restore clocks, stop the
monitor, exit 0. SIGHUP: re-read the config and apply what can change live (display, log level,
monitor interval, metrics interval), saying which changed. A user error exits 2 and a crash exits 1
(after a checkpoint if possible, with clocks restored), so ``Restart=on-failure`` applies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edgerl.config import Config, build_layers, field_info, keys, resolve, with_values
from edgerl.errors import EdgerlError
from edgerl.report.hooks import Hook, Run
from edgerl.report.metrics import TrainStats, progress_fields
from edgerl.report.rundir import run_section, service_run_dir
from edgerl.service.logs import set_level, setup_service_logging
from edgerl.service.notify import Notifier, watchdog_interval_s

if TYPE_CHECKING:  # torch: imported once the first words are said
    from edgerl.hw.clocks import MaxClocks
    from edgerl.run.calibrate import Progress, Stop
    from edgerl.run.signals import StopRequest
    from edgerl.run.train import Trainer

log = logging.getLogger(__name__)

STATUS_EVERY_S = 5.0
# What systemd is asked to allow for the set-up after a measurement (EXTEND_TIMEOUT_USEC): the
# unit's own TimeoutStartSec=, which the measurement may have used up.
SET_UP_ALLOW_S = 600.0
LIVE_KEYS = [k for k in keys() if field_info(k)[0].metadata.get("live")]


def daemon_config(
    config_file: Path | None,
    recipe: bool = True,
    measure: bool = True,
    stop: Stop | None = None,
    progress: Progress | None = None,
) -> Config:
    """The service's config: the usual layers, with service defaults for keys nobody set. A
    config that chooses no learner (``agent.algo``) trains this machine's recipe for its game
    (:func:`edgerl.run.families.board_layer`: measured at the first start, remembered after;
    a game no run on record trained: its family's, unmeasured) under it, with evaluations that
    fit the run: what the config sets wins, its game included (``recipe`` False: without it,
    for commands that need only where the service's run is; ``measure`` False: a remembered
    calibration or none, for a reload while training runs; ``stop`` and ``progress`` as
    :func:`edgerl.run.calibrate.calibrate` takes them)."""
    layers = build_layers(config_file)
    cfg = resolve(layers)
    if recipe and takes_recipe(cfg):
        from edgerl.run.families import board_layer, fit_evaluations

        said = set(cfg.explicit)
        run_dir = Path(cfg.train.run_dir) if cfg.train.run_dir else service_run_dir(cfg.env.id)
        game = cfg.env.id if "env.id" in said else None
        chosen = board_layer(
            cfg.hw.calibrate, measure, game=game, run_dir=run_dir, stop=stop, progress=progress
        )
        cfg = fit_evaluations(resolve([chosen, *layers]), said)
    service_defaults = {
        "hw.max_clocks": True,
        "train.run_dir": str(service_run_dir(cfg.env.id)),
    }
    return with_values(cfg, {k: v for k, v in service_defaults.items() if k not in cfg.explicit})


def takes_recipe(cfg: Config) -> bool:
    """Whether the service trains this machine's recipe: its config sets no learner, and its
    run directory holds no run trained without a recipe (a service set up before recipes goes
    on with the run it has, as it was configured)."""
    if "agent.algo" in cfg.explicit:
        return False
    run_dir = Path(cfg.train.run_dir) if cfg.train.run_dir else service_run_dir(cfg.env.id)
    saved = run_section(run_dir, "train")
    return saved is None or bool(saved.get("recipe"))


def live_changes(
    requested: Config, reread: Config, running: Config
) -> tuple[Config, list[str], list[str]]:
    """What a reload can do: (``running`` with the live keys of ``reread``, those changes as
    "key old -> new", the other keys that changed, which apply only after a restart).

    A live key changes when the re-read file says other than what runs. Any other key is named
    only if the file changed it since start: ``requested`` and ``reread`` are both taken before
    presets and autotune, which change what runs but are no edit of the user's.
    """
    live = [k for k in LIVE_KEYS if running.get(k) != reread.get(k)]
    applied = with_values(running, {k: reread.get(k) for k in live})
    described = [f"{k} {running.get(k)} -> {reread.get(k)}" for k in live]
    restart = [k for k in keys() if k not in LIVE_KEYS and requested.get(k) != reread.get(k)]
    return applied, described, restart


class ServiceHook(Hook):
    """READY, STATUS, WATCHDOG and STOPPING from the training loop; SIGHUP reloads there too."""

    def __init__(self, notifier: Notifier, config_file: Path | None, debug: bool = False) -> None:
        self.notifier = notifier
        self.config_file = config_file
        self.debug = debug
        self.watchdog_s = watchdog_interval_s()
        self._last_watchdog = 0.0
        self._last_status = 0.0
        self.reload_requested = False
        self.checkpoint_problem: str | None = None
        self._trainer: Trainer | None = None

    def serve(self, trainer: Trainer) -> None:
        """The trainer this hook may reconfigure when a reload is requested."""
        self._trainer = trainer

    def status_line(self, run: Run, stats: TrainStats) -> str:
        text = f"step {run.step:,}/{run.cfg.train.steps:,} | {progress_fields(stats)}"
        if self.checkpoint_problem:
            text += f" | {self.checkpoint_problem}"
        for problem in run.write_problems():
            text += f" | {problem}"
        return text

    def on_start(self, run: Run) -> None:
        self.notifier.ready(f"training {run.cfg.env.id} from step {run.step:,}")
        log.info("ready: training %s, run directory %s", run.cfg.env.id, run.run_dir)

    def _watchdog(self, now: float) -> None:
        if self.watchdog_s is not None and now - self._last_watchdog >= self.watchdog_s:
            self.notifier.watchdog()
            self._last_watchdog = now

    def on_wait(self, run: Run) -> None:
        """The run's end waits for its last evaluation, however long it plays: systemd is
        told the loop is alive meanwhile."""
        self._watchdog(time.monotonic())

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        now = time.monotonic()
        self._watchdog(now)
        if now - self._last_status >= STATUS_EVERY_S:
            self.notifier.status(self.status_line(run, stats))
            self._last_status = now
        if self.reload_requested and self._trainer is not None:
            self.reload_requested = False
            self.reload(self._trainer)

    def on_checkpoint(self, run: Run, path: Path | None, error: str | None) -> None:
        if error is None:
            if self.checkpoint_problem:
                log.info("checkpoint written again: %s", path)
            self.checkpoint_problem = None
            return
        self.checkpoint_problem = f"checkpoint failed, retrying: {error}"
        self.notifier.status(self.checkpoint_problem)

    def on_end(self, run: Run) -> None:
        self.notifier.stopping(f"stopping at step {run.step:,}: writing a checkpoint")

    def reload(self, trainer: Trainer) -> list[str]:
        """Re-read the config and hand the trainer its live keys; returns the changes
        ("key old -> new"). Called from the training loop."""
        self.notifier.reloading()
        try:
            new = daemon_config(self.config_file, measure=False)
        except EdgerlError as e:
            log.error("reload failed, keeping the running config: %s", e)
            self.notifier.ready(f"reload failed: {e}")
            return []
        applied, changes, restart = live_changes(trainer.requested_cfg, new, trainer.cfg)
        if changes:
            trainer.reconfigure(applied)
            set_level(self.debug, applied.log.level)
        log.info(
            "reloaded %s: %s",
            self.config_file or "the config",
            "; ".join(changes) if changes else "nothing that can change live changed",
        )
        if restart:
            log.warning("changed but only applied after a restart: %s", ", ".join(restart))
        self.notifier.ready(f"reloaded: {'; '.join(changes) or 'no live change'}")
        return changes


def run(config_file: Path | None, debug: bool = False) -> int:
    """The service's main: returns the exit code (0 stopped, 2 user error, 1 crash)."""
    from edgerl.run.signals import StoppedDuringSetup, StopRequest, stop_on_signals

    notifier = Notifier()
    setup_service_logging(debug, "info")
    hook = ServiceHook(notifier, config_file, debug)
    stop = StopRequest()

    def hangup() -> None:  # heard from the first moment; the training loop reloads
        hook.reload_requested = True

    def request_stop(reason: str) -> None:
        notifier.stopping(f"{reason}: finishing the step, then a checkpoint")
        stop.set(reason)

    try:
        with stop_on_signals(request_stop, hangup), contextlib.ExitStack() as hardware:
            cfg = daemon_config(config_file, recipe=False)  # a user's error before anything
            setup_service_logging(debug, cfg.log.level)
            say_what_it_does(cfg, takes_recipe(cfg), notifier)
            clocks = max_clocks(cfg, hardware)  # before the measuring: the clocks it trains at
            if stop.reason is not None:
                raise StoppedDuringSetup(stop.reason)
            cfg = daemon_config(config_file, stop=lambda: stop.reason, progress=notifier.extend)
            notifier.extend(f"setting up {cfg.env.id}", SET_UP_ALLOW_S)
            return train(cfg, hook, stop, clocks)
    except StoppedDuringSetup as e:
        log.info("%s: no step was taken, nothing was lost", e)
        return 0
    except EdgerlError as e:
        log.error("%s", e)
        notifier.status(f"failed: {e}")
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        log.exception("the training loop crashed")
        notifier.status(f"crashed: {type(e).__name__}: {e}")
        return 1
    finally:
        notifier.close()


def say_what_it_does(cfg: Config, recipe: bool, notifier: Notifier) -> None:
    """The first words: what the service will train and where (started by hand: a warning
    that it is not under systemd; under it: STATUS=)."""
    if recipe:
        what = (
            f"trains {cfg.env.id} with this machine's recipe (measured at its first start, "
            f"remembered after) in {cfg.train.run_dir}"
        )
    else:
        what = f"trains {cfg.env.id} for {cfg.train.steps:,} steps in {cfg.train.run_dir}"
    if not os.environ.get("INVOCATION_ID") and not os.environ.get("NOTIFY_SOCKET"):
        log.warning(
            "not started by systemd: edgerl daemon is what `systemctl start edgerl` runs; by "
            "hand it %s as the service would, and stops with Ctrl-C (a run of your own: "
            "edgerl train)",
            what,
        )
    else:
        log.info("starting: edgerl daemon %s", what)
    notifier.status(f"starting: {what}")


def max_clocks(cfg: Config, stack: contextlib.ExitStack) -> MaxClocks | None:
    """The clocks maxed for as long as ``stack`` holds them (``hw.max_clocks``), else None."""
    from edgerl.hw.clocks import MaxClocks, state_dir_for

    if not cfg.hw.max_clocks:
        return None
    return stack.enter_context(MaxClocks(cfg.hw, state_dir_for(cfg.hw)))


def train(cfg: Config, hook: ServiceHook, stop: StopRequest, clocks: MaxClocks | None) -> int:
    """Train ``cfg`` as the service: 0 once stopped or finished (raises what the session
    raises)."""
    from edgerl.service.session import training_session

    with training_session(cfg, hooks=[hook], stop=stop, clocks=clocks) as session:
        stop.target = session.trainer.request_stop
        hook.serve(session.trainer)
        hook.notifier.status(f"set up; taking the first step of {cfg.env.id}")
        result = session.trainer.run()
    log.info(
        "stopped at step %s of %s; checkpoint %s",
        f"{result.step:,}",
        f"{result.total_steps:,}",
        result.checkpoint,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(None))
