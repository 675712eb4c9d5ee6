"""A Ctrl-C while `edgerl train` starts up (signals.py, cli/training.py, logs.py): whenever it
lands, even inside the import of torch or numpy, the run stops with one sentence, exit code 130."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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
