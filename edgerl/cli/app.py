"""The ``edgerl`` command group and :func:`main`, which turns every error into an exit code.

Exit codes: 0 done, 2 a user error (one sentence on stderr, no traceback; ``--debug`` shows it),
1 an internal error, 130/143 stopped by SIGINT/SIGTERM after writing a checkpoint. Commands that
check something (``status``, ``doctor``) say in their help which codes they use.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import sys
import threading

import click

from edgerl import __version__
from edgerl.errors import EdgerlError
from edgerl.hw import cpus
from edgerl.service.logs import setup_logging

log = logging.getLogger("edgerl")


def command_name(
    argv: list[str] | None = None, orig_argv: list[str] | None = None, path: str | None = None
) -> str:
    """How to run this edgerl again from the shell it was started in, for the commands it
    suggests: ``edgerl`` when that name on PATH is this program (an activated venv, the Jetson
    install), else the path it was started by (``.venv/bin/edgerl``, as ``make run`` does), else
    ``python -m edgerl.cli`` as it was started. Pasted, a suggestion runs."""
    argv = sys.argv if argv is None else argv
    orig = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    started = argv[0] if argv else ""
    if os.path.basename(started) == "edgerl":
        found = shutil.which("edgerl", path=path)
        if found is not None and os.path.realpath(found) == os.path.realpath(started):
            return "edgerl"
        return shlex.quote(started)
    if len(orig) >= 3 and orig[1] == "-m" and orig[2].startswith("edgerl"):
        return " ".join(shlex.quote(a) for a in orig[:3])
    return "edgerl"  # called from Python (tests, another program): the documented name


def interrupted(args: list[str]) -> str:
    """What a Ctrl-C that reached the command line says: only training has checkpoints to name,
    and it names the newest this process wrote (a second Ctrl-C during the last save may come
    after it was written: it said "without writing a checkpoint" then)."""
    command = next((a for a in args if not a.startswith("-")), "")
    if command not in ("train", "daemon"):
        return "interrupted"
    # Not imported here: a Ctrl-C may have cut torch's own import short. Never loaded: none.
    module = sys.modules.get("edgerl.files.checkpoint")
    written = getattr(module, "WRITTEN", None) or []
    if not written:
        return (
            "interrupted: stopped at once, before this session wrote a checkpoint (the run "
            "resumes from its newest valid one)"
        )
    return (
        f"interrupted: stopped at once; this session's newest checkpoint is {written[-1]} (the "
        "run resumes from it, or from the one before if it is damaged)"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(__version__, prog_name="edgerl")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """edgerl: train RL agents on Atari on the device, watch them, export to TensorRT."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    setup_logging(debug)


def ctrl_c_interrupts() -> None:
    """Ctrl-C (SIGINT) stops every command, also one started with SIGINT ignored: a shell
    script's background job, or ``timeout -s INT`` run from one, hands its programs SIGINT
    ignored, and Python then installs no handler of its own (``edgerl train`` and ``bench``
    install theirs; ``play``, ``export`` and ``serve`` ran on after such a SIGINT). Off the main
    thread (a test's), nothing."""
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (never raises for user errors)."""
    cpus.mark()  # other programs' CPU use is measured from here (perf.threads=0)
    if argv is None:  # the command itself, not a caller's in-process call (a test's)
        ctrl_c_interrupts()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        rv = cli.main(args=args, prog_name="edgerl", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.NoArgsIsHelpError as e:
        # `edgerl` or `edgerl hw` alone asks what there is: the help, as --help gives it
        click.echo(e.ctx.get_help())
        return 0
    except click.UsageError as e:  # one sentence, and where the command's options are listed
        where = e.ctx.command_path if e.ctx is not None else "edgerl"
        said = e.format_message().rstrip(".")
        click.echo(f"edgerl: error: {said} (see '{where} --help')", err=True)
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Abort:  # Ctrl-C before edgerl's handlers, or a second one
        click.echo(interrupted(args), err=True)
        return 130
    except EdgerlError as e:
        if debug:
            log.exception("user error")
        click.echo(f"edgerl: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo(interrupted(args), err=True)
        return 130
    except Exception as e:
        if debug:
            log.exception("internal error")
        click.echo(
            f"edgerl: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
            err=True,
        )
        return 1
    return rv if isinstance(rv, int) else 0
