"""Logging (logs.py): what reaches the user's terminal, and what does not."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A Ctrl-C that lands while `edgerl play` imports torch, right after torch registered the atexit
# hook that logs its FakeTensor cache statistics (the import that follows is interrupted).
INTERRUPTED_IMPORT = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    class CtrlC(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch._subclasses.fake_utils":
                raise KeyboardInterrupt
            return None

    sys.meta_path.insert(0, CtrlC())
    from edgerl.cli import main
    sys.exit(main(["play", "--run-dir", sys.argv[1]]))
    """
)


def test_a_ctrl_c_while_torch_is_imported_ends_with_one_sentence(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 130, r.stderr  # the interrupt landed in torch's import
    assert r.stderr.strip().splitlines()[-1] == "interrupted"
    assert "FakeTensor" not in r.stderr and "cache_hits" not in r.stderr, r.stderr
