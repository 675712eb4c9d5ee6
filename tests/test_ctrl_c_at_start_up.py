"""A Ctrl-C while `edgerl train` starts up (signals.py, cli/training.py, logs.py): whenever it
lands, even inside the import of torch or numpy, the run stops with one sentence, exit code 130."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .conftest import edgerl_cmd

# SIGINT sent to the process itself as the import of MODULE begins: a real signal, arriving in the
# middle of the imports that `edgerl train` starts with.
SIGINT_DURING_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    from importlib.abc import MetaPathFinder

    class CtrlC(MetaPathFinder):
        sent = False

        def find_spec(self, name, path=None, target=None):
            if name == sys.argv[1] and not CtrlC.sent:
                CtrlC.sent = True
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, CtrlC())
    from edgerl.cli import main
    code = main(["train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", sys.argv[2]])
    print("sent" if CtrlC.sent else "not sent")
    sys.exit(code)
    """
)


@pytest.mark.parametrize(
    "module",
    [
        "torch._subclasses.fake_utils",  # torch has registered its FakeTensor statistics at exit
        "numpy.matrixlib",  # numpy, imported by torch's C start-up, which swallows exceptions
    ],
)
def test_a_ctrl_c_during_the_imports_stops_start_up_with_one_sentence(module, tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", SIGINT_DURING_IMPORT, module, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.stdout.strip() == "sent", f"{module} was not imported: the test needs another module"
    assert r.returncode == 130, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == "stopped by SIGINT during start-up: no step was taken, nothing was lost", (
        r.stderr
    )
    assert "FakeTensor" not in r.stderr and "internal error" not in r.stderr, r.stderr


def test_ctrl_c_stops_a_command_started_with_sigint_ignored(tmp_path, cli):
    """A shell script's background job starts with SIGINT ignored; `edgerl play` then played on
    after SIGINT (train and bench installed handlers of their own, the other commands none)."""
    run = tmp_path / "run"
    assert cli("train", "--env", "CartPole-v1", "--run-dir", run, "--steps", "200").code == 0
    proc = subprocess.Popen(
        edgerl_cmd("play", "--run-dir", run, "--episodes", "100000", "--fps", "20"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        said = select.select([proc.stderr], [], [], 300)[0]
        assert said, "play said nothing within 300 s"
        first = proc.stderr.readline()  # it says which policy it plays: it is running
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # it played on: the failure this test is for
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, first + err
