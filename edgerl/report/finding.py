"""Finding runs below a folder, for the commands that pick a run by themselves (``status``,
``view``, ``play``, ``export``) and those that read many (``results``): a folder of runs, and
in it the folders of seeds' runs that ``edgerl train --seeds`` writes (``runs/<name>/seed-K``),
which are runs as much as the others."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from edgerl.report.rundir import holds_run
from edgerl.report.status import STATUS_FILE


def runs_below(root: Path, mark: str) -> list[Path]:
    """The run directories below ``root`` that hold ``mark`` (a file or folder of a run's:
    ``status.json``, ``checkpoints``): its folders, and the folders of those that hold no run
    themselves (``edgerl train --seeds``' ``seed-K`` runs in ``runs/<name>``). Folders that
    cannot be read are passed over."""
    found = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    for child in children:
        if os.path.lexists(child / mark):
            found.append(child)
        elif not holds_run(child):
            with contextlib.suppress(OSError):
                found += sorted(p for p in child.iterdir() if os.path.lexists(p / mark))
    return found


def find_status_dirs(roots: list[Path]) -> list[Path]:
    """Run directories with a status.json below ``roots`` (each a run, a folder of runs, or a
    folder of folders of seeds' runs: :func:`runs_below`), most recently
    updated first."""
    found = []
    for root in roots:
        try:  # a folder this user may not read is passed over (its reader says why)
            if (root / STATUS_FILE).is_file():
                found.append(root)
            elif root.is_dir():
                below = runs_below(root, STATUS_FILE)
                found += [p for p in below if (p / STATUS_FILE).is_file()]
        except OSError:
            continue

    def updated(run: Path) -> float:
        try:
            return (run / STATUS_FILE).stat().st_mtime
        except OSError:  # gone since it was found (a run moved aside by --fresh)
            return 0.0

    return sorted(set(found), key=updated, reverse=True)
