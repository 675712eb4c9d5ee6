"""edgerl/run/signals.py's said_while_held: a stop that comes while one call holds Python's lock
(ALE building an Atari game's environments) is said at once by a helper reading Python's wakeup
pipe. Here the bytes that pipe carries are made by real signals a process sends itself; the whole
path with ALE is tests/test_board_first_start.py's Ctrl-C test."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from edgerl.run.signals import said_while_held, stop_on_signals

    heard = []
    signal.signal(signal.SIGHUP, lambda *a: heard.append("HUP"))
    with stop_on_signals(heard.append):
        with said_while_held("a test call") as call:
            os.kill(os.getpid(), signal.SIGINT)  # before the call: Python's handler says it
            call.arm()
            os.kill(os.getpid(), signal.SIGHUP)  # not a stop
            os.kill(os.getpid(), signal.SIGTERM)  # a stop inside the call: said
            os.kill(os.getpid(), signal.SIGTERM)  # said once
    print(heard)
    """
)


def test_a_stop_inside_the_call_is_said_once_and_nothing_else_is():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['SIGINT', 'HUP', 'SIGTERM', 'SIGTERM']", done
    said = done.stderr.strip().splitlines()
    assert said == [
        "INFO SIGTERM heard while a test call: that call holds Python, so edgerl stops as "
        "soon as it returns"
    ], done.stderr


def test_where_it_cannot_listen_it_changes_nothing():
    """Off the main thread (no wakeup fd can be set there), and where another reader of
    signals has set one (an event loop), the body runs with nothing started or changed."""
    script = textwrap.dedent(
        """
        import os, signal, threading
        from edgerl.run.signals import said_while_held

        seen = []

        def body():
            with said_while_held("a test call") as call:
                call.arm()
                seen.append("ran")

        t = threading.Thread(target=body)
        t.start()
        t.join()
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        body()
        seen.append(signal.set_wakeup_fd(-1) == w)
        print(seen)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ran', 'ran', True]", done
    assert done.stderr == "", done.stderr


FORM_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from edgerl.run.signals import said_while_held, stop_on_signals
    from edgerl.service.logs import setup_logging, setup_service_logging

    if sys.argv[1] == "journal":
        os.environ["JOURNAL_STREAM"] = "8:1234"
        setup_service_logging(False, "info")
    else:
        setup_logging(False)
    with stop_on_signals(lambda name: None):
        with said_while_held("a test call") as call:
            call.arm()
            os.kill(os.getpid(), signal.SIGINT)
    """
)


@pytest.mark.parametrize(
    ("where", "line"),
    [
        # under systemd: journald's priority, as every line of edgerl's there, and no time
        ("journal", r"<6>SIGINT heard while a test call: that call holds Python, .*"),
        # on a terminal: the time of the signal, as the log's lines begin
        ("terminal", r"\d\d:\d\d:\d\d INFO SIGINT heard while a test call: .*"),
    ],
)
def test_the_line_said_begins_as_the_logs_own_lines(where, line):
    done = subprocess.run(
        [sys.executable, "-c", FORM_SCRIPT, where], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    said = [s for s in done.stderr.splitlines() if "heard while" in s]
    assert len(said) == 1 and re.fullmatch(line, said[0]), done.stderr
