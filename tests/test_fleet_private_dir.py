"""A fleet's Ray instance of its own (no fleet.address), started here once for this module's
tests: Ray makes its temporary directory, the session's, sockets/, logs/ and
runtime_resources/* mode 0777 without the sticky bit, so another account could delete, rename
and plant files among the instance's sockets and logs. They must lie inside a folder that only
the account running edgerl can enter."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NOBODY = 65534

# Run as root, drops to nobody, then tries what the other account did to root's instance.
AS_NOBODY = """
import errno, json, os, sys
os.setgroups([])
os.setgid(int(sys.argv[1]))
os.setuid(int(sys.argv[1]))
seen = {}
for folder, victim in zip(sys.argv[2::2], sys.argv[3::2]):
    tries = {
        "list": lambda: os.listdir(folder),
        "create": lambda: os.close(
            os.open(os.path.join(folder, "planted"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        ),
        "rename": lambda: os.rename(
            os.path.join(folder, victim), os.path.join(folder, victim + ".moved")
        ),
        "delete": lambda: os.unlink(os.path.join(folder, victim)),
    }
    for name, attempt in tries.items():
        try:
            attempt()
            seen[f"{os.path.basename(folder)} {name}"] = "done"
        except OSError as e:
            seen[f"{os.path.basename(folder)} {name}"] = errno.errorcode[e.errno]
print(json.dumps(seen))
"""


# A process of its own: Ray, once imported, keeps the token it first read, so a local instance
# started in a test process that has joined another cluster would not accept its own client.
LOCAL = """
import json, sys
from edgerl.config.fleet import FleetConfig
from edgerl.fleet.cluster import Cluster

cluster = Cluster(FleetConfig(object_store_mb=80))
ray = cluster.open()
try:  # where Ray really put its session (its node knows; no public API says)
    print(json.dumps(ray._private.worker._global_node.get_session_dir_path()), flush=True)
    sys.stdin.read()  # until the tests are done with it
finally:
    cluster.close()
"""


@dataclass
class LocalInstance:
    session: Path  # Ray's session folder, as Ray reports it
    made: Path  # the folder in /tmp that holds it


@pytest.fixture(scope="module")
def local_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalInstance]:
    if importlib.util.find_spec("ray") is None:  # not imported here: see LOCAL
        pytest.skip("Ray is not installed (the fleet extra)")
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), PYTHONFAULTHANDLER="1")  # no ~/.ray/auth_token either
    with (home / "stderr").open("w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", LOCAL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, text=True, cwd=home, env=env,
        )  # fmt: skip
        made = None
        try:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, (home / "stderr").read_text()[-3000:]
            session = Path(json.loads(line))
            top = Path("/tmp")  # where edgerl makes it: short, for Ray's socket paths
            assert session.is_relative_to(top), session
            made = top / session.relative_to(top).parts[0]
            yield LocalInstance(session, made)
            proc.stdin.close()  # type: ignore[union-attr]
            assert proc.wait(timeout=120) == 0, (home / "stderr").read_text()[-3000:]
        finally:
            if proc.poll() is None:  # a test failed: stopped by its id, Ray's processes with it
                proc.kill()  # (Ray kills a local instance's when its driver dies)
                proc.wait()
                if made is not None:
                    shutil.rmtree(made, ignore_errors=True)
    assert made is not None and not made.exists()  # all of it removed with the instance


def test_a_local_instance_lies_in_a_folder_only_its_owner_can_enter(local_instance):
    """Ray's session (sockets, logs) is below a folder edgerl made: this account's, 0700, no
    link, removed with the instance; Ray's socket paths stay within Linux's limit."""
    made, session = local_instance.made, local_instance.session
    assert made.name.startswith("edgerl-ray-"), made  # edgerl's, not Ray's /tmp/ray
    info = made.lstat()
    assert stat.S_ISDIR(info.st_mode), f"{made} is not a folder (a link?)"
    assert info.st_uid == os.geteuid()
    assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
    assert session.resolve() == session  # no link on the way down from the folder
    assert (session / "sockets").is_dir() and (session / "logs").is_dir()
    longest = max(len(os.fsencode(p)) for p in (session / "sockets").iterdir())
    assert longest <= 107  # Linux's limit for a Unix socket's path


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another account (nobody) needs root")
def test_another_account_cannot_touch_the_instances_sockets_or_logs(local_instance, tmp_path):
    """nobody can neither list nor plant, rename or delete a file in sockets/ or logs/,
    whatever modes Ray gave them."""
    args = [str(NOBODY)]
    for name in ("sockets", "logs"):
        folder = local_instance.session / name
        victim = min(p.name for p in folder.iterdir() if not p.is_dir())  # one of Ray's files
        args += [str(folder), victim]
    r = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, *args], capture_output=True, text=True,
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout)
    assert len(seen) == 8 and set(seen.values()) == {errno.errorcode[errno.EACCES]}, seen
