"""edgerl/run/signals.py's said_while_held: a stop that comes while one call holds Python's lock
(ALE building an Atari game's environments) is said at once by a helper reading Python's wakeup
pipe. Here the bytes that pipe carries are made by real signals a process sends itself; the whole
path with ALE is tests/test_board_first_start.py's Ctrl-C test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
