"""scripts/arm64_check.sh runs as root and trusts no path another user could have made: each
folder on the way to its arm64 root and its log folder is looked at as written, from / down, and a
link anywhere is refused, not followed (a trailing slash, a folder above, a .. after a link).

Each case runs the real script with a board that does not exist: its path checks come first, so a
refused path stops it there (exit 2, one line naming the path), and an accepted one stops at the
next check (exit 1: no such board, or a tool missing here), before anything is made or mounted.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "arm64_check.sh"
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the script's owner checks are root's: run the tests as root"
)
# what stops an accepted path: the checks after the paths' (root, tools, the board)
AFTER_THE_PATHS = (
    "debootstrap is missing",
    "qemu-user-static is missing",
    "no board no_such_board",
)


def run(
    *args: str, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """The script with ``args`` and a board that does not exist: it stops at its checks."""
    base = {k: v for k, v in os.environ.items() if k not in ("SUDO_UID", "OUT", "PWD")}
    return subprocess.run(
        ["bash", str(SCRIPT), "--board", "no_such_board", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**base, **(env or {})},
    )


def tree(top: Path) -> list:
    """Every name under ``top`` (itself included) with its mode, owner and modification time."""
    out = []
    for path in sorted([top, *top.rglob("*")]):
        st = path.lstat()
        out.append((str(path), st.st_mode, st.st_uid, st.st_mtime_ns))
    return out


@pytest.fixture
def place(tmp_path):
    """tmp_path (root's, 0700, under /tmp) with a folder elsewhere/target/inner, a link to
    target, a link to that link and a root-owned folder "fine" to give as the other path."""
    (tmp_path / "elsewhere" / "target" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "target")
    (tmp_path / "linklink").symlink_to(tmp_path / "link")
    (tmp_path / "fine").mkdir()
    return tmp_path


def refused(r: subprocess.CompletedProcess, what: str, *names: str) -> str:
    """The one line the script said, exiting 2: ``what`` is refused and each name is in it."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    line = r.stderr.strip()
    assert line.startswith(f"arm64_check: error: {what} "), line
    for name in names:
        assert name in line, (name, line)
    return line


# (which option, the path under tmp_path as given, the link it must name, as written)
LINKED = [
    ("--root", "link/", "link"),
    ("--root", "link//", "link"),
    ("--root", "link/.", "link"),
    ("--root", "linklink/", "linklink"),
    ("--root", "link/sub", "link"),
    ("--root", "link/sub/", "link"),
    ("--root", "link/inner", "link"),  # a folder that is there, under the link
    ("--root", "link/inner/deeper/", "link"),
    ("--root", "link/..", "link"),  # the target's parent, by way of the link
    ("--root", "link/../sub", "link"),
    ("--root", "link/inner/../sub", "link"),
    ("--root", "fine/../link/", "fine/../link"),
    ("--out", "link/", "link"),
    ("--out", "link//", "link"),
    ("--out", "link/sub", "link"),
    ("--out", "link/sub/", "link"),
    ("--out", "link/../sub", "link"),
    ("--out", "linklink/inner", "linklink"),
]
WHAT = {"--root": "the arm64 root", "--out": "the log folder (--out)"}


@pytest.mark.parametrize(
    ("option", "given", "link"), LINKED, ids=[f"{o[2:]}={g}" for o, g, _ in LINKED]
)
def test_a_link_anywhere_on_the_way_is_refused_before_anything_runs(place, option, given, link):
    before = tree(place / "elsewhere")
    path = f"{place}/{given}"
    other = ["--out", str(place / "out")] if option == "--root" else ["--root", str(place / "r")]
    line = refused(run(option, path, *other), WHAT[option], path, "is a symbolic link")
    assert f"{place}/{link}" in line
    assert tree(place / "elsewhere") == before  # the link's target: nothing made, nothing changed
    assert not (place / "out").exists() and not (place / "r").exists()


def test_a_relative_path_or_the_out_variable_through_a_link_is_refused(place):
    before = tree(place / "elsewhere")
    line = refused(run("--root", "link/", cwd=place), "the arm64 root", "is a symbolic link")
    assert f"{place}/link/" in line  # named in full, from the real working folder
    line = refused(run("--root", "link/sub", cwd=place), "the arm64 root", "is a symbolic link")
    assert f"{place}/link/sub is inside {place}/link," in line
    r = run("--root", str(place / "r"), env={"OUT": f"{place}/link/"})
    refused(r, "the log folder (--out)", f"{place}/link/", "is a symbolic link")
    r = run("--root", str(place / "r"), env={"OUT": f"{place}/link/sub"})
    refused(r, "the log folder (--out)", f"{place}/link/sub", "is a symbolic link")
    assert tree(place / "elsewhere") == before


def test_a_folder_on_the_way_another_user_owns_or_anyone_may_write_is_refused(place):
    nobodys = place / "nobodys"
    (nobodys / "sub").mkdir(parents=True)
    os.chown(nobodys, NOBODY, NOBODY)
    open_dir = place / "open"
    (open_dir / "sub").mkdir(parents=True)
    open_dir.chmod(0o777)  # others may write, no sticky bit: they can rename what is in it
    cases = [
        ("--root", f"{nobodys}/root", f"inside {nobodys}, which is not root's"),
        ("--root", f"{nobodys}/sub/root/", f"inside {nobodys}, which is not root's"),
        ("--root", f"{nobodys}/sub/../root", f"inside {nobodys}, which is not root's"),
        ("--root", f"{nobodys}/", "is not owned by root"),
        ("--out", f"{nobodys}//sub", f"inside {nobodys}, which is not root's"),
        ("--root", f"{open_dir}/root", f"inside {open_dir}, which other users can write"),
        ("--root", f"{open_dir}/sub/", f"inside {open_dir}, which other users can write"),
        ("--root", f"{open_dir}/./sub//x", f"inside {open_dir}, which other users can write"),
        ("--root", f"{open_dir}/sub/..", f"inside {open_dir}, which other users can write"),
        ("--out", f"{open_dir}/out/", f"inside {open_dir}, which other users can write"),
    ]
    for option, path, says in cases:
        other = ["--out", str(place / "out")] if option == "--root" else ["--root", str(place)]
        refused(run(option, path, *other), WHAT[option], path, says)
    assert sorted(p.name for p in nobodys.iterdir()) == ["sub"]
    assert sorted(p.name for p in open_dir.iterdir()) == ["sub"] and not (place / "out").exists()


def test_a_file_on_the_way_or_given_with_a_trailing_slash_is_not_a_folder(place):
    file = place / "file"
    file.write_text("")
    r = run("--root", f"{file}/sub", "--out", str(place / "out"))
    refused(r, "the arm64 root", f"{file}/sub is inside {file}, which is not a folder")
    r = run("--root", f"{file}/", "--out", str(place / "out"))
    refused(r, "the arm64 root", f"{file}/ is not a folder")
    r = run("--root", str(place / "r"), "--out", f"{file}//")
    refused(r, "the log folder (--out)", f"{file}// is not a folder")
    assert file.read_text() == "" and not (place / "out").exists()


def accepted(r: subprocess.CompletedProcess) -> None:
    """The paths passed their checks: the script stopped at a later one (exit 1), one line."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and any(s in r.stderr for s in AFTER_THE_PATHS), r.stderr


def test_plain_root_folders_under_a_sticky_folder_are_still_accepted_as_written(place):
    sticky = place / "sticky"
    (sticky / "root").mkdir(parents=True)
    sticky.chmod(0o1777)  # as /tmp: nobody can rename what another owns in it
    (sticky / "root").chmod(0o755)
    for root in ("root", "root/", "root//", "./root/.", "root/../root", "new/sub/"):
        accepted(run("--root", f"{sticky}/{root}", "--out", f"{sticky}/out/"))
    accepted(run("--root", "sticky/root/", "--out", "sticky//out", cwd=place))
    accepted(run("--root", f"{sticky}/root", env={"OUT": f"{sticky}/out//"}))
    assert sorted(p.name for p in sticky.iterdir()) == ["root"]  # nothing made
    tmp = Path("/tmp")
    st = tmp.lstat()
    if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & stat.S_ISVTX:
        with tempfile.TemporaryDirectory(dir=tmp) as made:  # root's, 0700, in the real /tmp
            accepted(run("--root", f"{made}/", "--out", f"{made}/out"))
            assert os.listdir(made) == []


def test_the_default_paths_are_accepted_from_a_working_folder_reached_by_a_link(place):
    """No --root or --out: the kept root under /var/lib and arm64-check in the working folder,
    the real one even where the shell's $PWD names it by a link."""
    keep = Path("/var/lib/edgerl-arm64")
    kept = keep.exists()
    work = place / "work"
    work.mkdir()
    accepted(run(cwd=work))
    (place / "worklink").symlink_to(work)
    accepted(run(cwd=place / "worklink", env={"PWD": str(place / "worklink")}))
    assert list(work.iterdir()) == [] and keep.exists() == kept
