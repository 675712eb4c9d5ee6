"""The frame stream (stream/__init__.py, stream/reader.py): the ring with and without readers,
torn and corrupt slots, permissions, and a real Pong trainer whose stream is damaged under it."""

from __future__ import annotations

import contextlib
import grp
import mmap
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from edgerl.config import DisplayConfig
from edgerl.envs import EnvSpec
from edgerl.stream import (
    DAMAGE_CHECK_EVERY_S,
    HEADER,
    SEQ,
    DisplayPublisher,
    FrameMeta,
    FrameRing,
    shm_path,
    slot_size,
)
from edgerl.stream.reader import FrameReader, StreamError

from .conftest import PONG_FAST, stop
from .helpers import ACTIONS, frame_for, meta_for


def test_the_ring_works_with_no_reader(tmp_path):
    with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
        for step in range(100):
            ring.publish(frame_for(step), meta_for(step))
        assert ring.writes == 100 and ring.path.exists()
        assert (tmp_path / "display.json").exists()
    assert not ring.path.exists() and not (tmp_path / "display.json").exists()


def test_reader_gets_the_newest_frame_once(tmp_path):
    with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
        reader = FrameReader(tmp_path)
        assert reader.latest() is None
        for step in range(1, 10):
            ring.publish(frame_for(step), meta_for(step))
        frame = reader.latest()
        assert frame is not None and frame.meta.step == 9
        assert frame.meta.q_values == tuple(float(i + 9) for i in range(6))
        assert (frame.pixels == 9).all() and reader.action_meanings == ACTIONS
        assert reader.latest() is None  # nothing new
        reader.close()


def test_torn_and_corrupt_slots_are_rejected(tmp_path):
    with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
        ring.publish(frame_for(1), meta_for(1))
        reader = FrameReader(tmp_path)
        with open(ring.path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
            base = HEADER.size  # slot 0
            SEQ.pack_into(mm, base, 2)  # a writer has begun slot 0 again and not finished
            assert reader.read_slot(0) is None
            SEQ.pack_into(mm, base, 1)  # back to consistent
            assert reader.read_slot(0) is not None
            pixel = base + slot_size(84, 84) - SEQ.size - 10
            mm[pixel] ^= 0xFF  # same sequence numbers, changed bytes: the CRC catches it
            assert reader.read_slot(0) is None
            mm.close()
        assert reader.torn == 2
        reader.close()


def test_concurrent_writer_never_yields_a_torn_frame(tmp_path):
    """A writer thread publishing as fast as it can; every frame read must be self-consistent."""
    with FrameRing(tmp_path, 84, 84, ACTIONS, slots=2) as ring:
        reader = FrameReader(tmp_path)
        stop = threading.Event()

        def write() -> None:
            step = 0
            while not stop.is_set():
                step += 1
                ring.publish(frame_for(step), meta_for(step))

        writer = threading.Thread(target=write)
        writer.start()
        seen = 0
        # 200 frames read, however slowly a busy machine runs the two threads (a minute at most)
        deadline = time.monotonic() + 60.0
        try:
            while seen < 200 and time.monotonic() < deadline:
                frame = reader.latest()
                if frame is None:
                    continue
                seen += 1
                assert (frame.pixels == frame.meta.step % 251).all()
                assert frame.meta.q_values[0] == float(frame.meta.step)
        finally:
            stop.set()
            writer.join()
        assert seen > 50, f"only {seen} frames read in a minute"
        reader.close()


def test_stream_permissions_and_group(tmp_path):
    group = "daemon"  # exists on Debian and Ubuntu (L4T)
    with FrameRing(tmp_path, 84, 84, ACTIONS, group=group) as ring:
        st = ring.path.stat()
        assert st.st_mode & 0o777 == 0o640
        assert st.st_gid == grp.getgrnam(group).gr_gid
    with FrameRing(tmp_path, 84, 84, ACTIONS, group="no-such-group") as ring:
        assert ring.group is None and ring.path.stat().st_mode & 0o777 == 0o640


def test_display_can_be_switched_live(tmp_path):
    pong = EnvSpec("ALE/Pong-v5", "frames", (4, 84, 84), "uint8", 6, tuple(ACTIONS))
    pub = DisplayPublisher(DisplayConfig(enabled=False), tmp_path, pong)
    assert not pub.active and not shm_path(tmp_path).exists()
    pub.configure(DisplayConfig(enabled=True, every=2))
    assert pub.active and shm_path(tmp_path).exists()
    assert [pub.due() for _ in range(4)] == [False, True, False, True]
    pub.configure(DisplayConfig(enabled=False))
    assert not shm_path(tmp_path).exists()
    cartpole = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("0", "1"))
    vector = DisplayPublisher(DisplayConfig(), tmp_path, cartpole)
    assert not vector.active  # nothing to show for vector observations


def test_shared_memory_is_gone_after_a_normal_end(tmp_path, cli):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "300", "--run-dir", run).code == 0
    assert not shm_path(run).exists() and not (run / "display.json").exists()


def test_header_layout_is_stable():
    # Readers of other edgerl versions rely on this: bump VERSION when it changes.
    assert HEADER.size == 48 and struct.calcsize("<Q") == SEQ.size
    assert os.path.basename(str(shm_path(Path("/x")))).startswith("edgerl-")


def test_a_frame_without_q_values_reads_back_without_them(tmp_path):
    with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
        ring.publish(frame_for(0), FrameMeta(step=0, action=2))  # a random action, no forward
        reader = FrameReader(tmp_path)
        frame = reader.latest()
        assert frame is not None and frame.meta.q_values == ()
        reader.close()


def test_a_truncated_ring_is_made_again_and_a_reader_says_so(tmp_path):
    with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
        ring.publish(frame_for(1), meta_for(1))
        reader = FrameReader(tmp_path)
        os.truncate(ring.path, 100)  # someone cuts the file short under both
        with pytest.raises(StreamError, match="shrank to 100 bytes while being watched"):
            reader.latest()
        reader.close()
        time.sleep(DAMAGE_CHECK_EVERY_S)  # the writer looks a few times a second
        ring.publish(frame_for(2), meta_for(2))  # the writer notices and starts a new stream
        assert ring.recreated == 1 and ring.path.stat().st_size == ring.size
        fresh = FrameReader(tmp_path)
        frame = fresh.latest()
        assert frame is not None and frame.meta.step == 2
        fresh.close()
        os.unlink(ring.path)  # replaced by a stranger's file
        ring.path.write_bytes(b"x" * ring.size)
        time.sleep(DAMAGE_CHECK_EVERY_S)
        ring.publish(frame_for(3), meta_for(3))
        assert ring.recreated == 2
        fresh = FrameReader(tmp_path)
        assert fresh.latest().meta.step == 3
        fresh.close()


def test_a_ring_emptied_and_regrown_by_its_own_writes_between_checks_is_made_again(tmp_path):
    """Truncated to nothing, then written whole again by the next frames (4 slots, a few steps)
    before the writer looked: the size is right, the header is zeros. The trainer's test saw
    this once in three runs, and no reader could open the stream for the rest of the run."""
    with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
        ring.publish(frame_for(0), meta_for(0))
        os.truncate(ring.path, 0)
        for step in range(1, ring.slots + 1):  # between two checks: the file regrows
            ring.publish(frame_for(step), meta_for(step))
        assert ring.path.stat().st_size == ring.size and ring.recreated == 0
        with pytest.raises(StreamError):
            FrameReader(tmp_path)
        time.sleep(DAMAGE_CHECK_EVERY_S)
        assert ring.damage() == "emptied or overwritten"
        ring.publish(frame_for(9), meta_for(9))
        assert ring.recreated == 1
        reader = FrameReader(tmp_path)
        assert reader.latest().meta.step == 9
        reader.close()


def still_running(proc: subprocess.Popen, deadline: float, what: str) -> None:
    """Fail with the trainer's own words if it ended, or if ``what`` has not come by
    ``deadline``."""
    if proc.poll() is None and time.monotonic() < deadline:
        return
    if proc.poll() is None:
        proc.kill()
    pytest.fail(f"no {what} (exit {proc.poll()}): {proc.communicate()[1][-3000:]}")


def test_the_trainer_survives_its_stream_truncated_or_replaced(live_trainer):
    run, proc = live_trainer
    path = shm_path(run)
    os.truncate(path, 0)  # writing this file through a mapping was a SIGBUS
    reader = None
    deadline = time.monotonic() + 300  # a loaded 2-core machine: minutes, not seconds
    while reader is None:  # the trainer makes a new stream and a viewer attaches to it
        still_running(proc, deadline, "a new stream after the truncation")
        with contextlib.suppress(StreamError, OSError):
            reader = FrameReader(run)
        time.sleep(0.1)
    first_session = reader.session
    reader.close()
    os.unlink(path)
    path.write_bytes(b"\0" * 4096)  # a stranger's file in its place
    frame = None
    deadline = time.monotonic() + 300
    while frame is None:
        still_running(proc, deadline, "a frame in a new stream after the replacement")
        with contextlib.suppress(StreamError, OSError):
            reader = FrameReader(run)
            frame = reader.latest()
            reader.close()
        time.sleep(0.1)
    assert reader.session != first_session
    err = stop(proc)
    assert proc.returncode == 143, err
    assert "made a new one" in err


# -- /dev/shm is every account's: nothing is made where another could be first ----------------


def test_the_stream_lives_in_a_directory_of_the_users_own(tmp_path, monkeypatch):
    from edgerl import stream

    monkeypatch.setattr(stream.layout, "SHM_DIR", tmp_path / "shm")
    (tmp_path / "shm").mkdir(mode=0o1777)
    umask = os.umask(0o077)  # a strict umask: the display group may still enter
    try:
        with FrameRing(tmp_path, 84, 84, ACTIONS) as ring:
            own = ring.path.parent
            assert own == tmp_path / "shm" / f"edgerl-{os.getuid()}"
            st = own.stat()
            assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o750
    finally:
        os.umask(umask)


@pytest.mark.parametrize("planted", ["link", "others may write", "another user's", "a file"])
def test_a_planted_stream_directory_is_refused_and_training_goes_on(
    tmp_path, monkeypatch, caplog, planted
):
    """What another local account can leave at the stream directory's name: a link (to a
    folder the trainer would then write into), a folder anyone may write in, a folder of its
    own, a file. The display says it cannot open and is off; nothing is written through it."""
    import logging

    from edgerl import stream

    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    monkeypatch.setattr(stream.layout, "SHM_DIR", shm)
    victim = tmp_path / "victim"
    victim.mkdir()
    at = shm / f"edgerl-{os.getuid()}"
    if planted == "link":
        at.symlink_to(victim)
    elif planted == "others may write":
        at.mkdir()
        at.chmod(0o777)
    elif planted == "another user's":
        if os.getuid() != 0:
            pytest.skip("only root can give a folder to another user")
        at.mkdir(mode=0o750)
        os.chown(at, 65534, -1)  # nobody
    else:
        at.write_text("not a folder")
    pong = EnvSpec("ALE/Pong-v5", "frames", (4, 84, 84), "uint8", 6, tuple(ACTIONS))
    with caplog.at_level(logging.WARNING, logger="edgerl.stream"):
        pub = DisplayPublisher(DisplayConfig(enabled=True), tmp_path, pong)
    assert not pub.active
    assert "display: cannot make the frame stream" in caplog.text
    assert "training goes on without it" in caplog.text
    assert list(victim.iterdir()) == []  # nothing written through a link


def test_a_reader_opens_nothing_but_a_stream_edgerl_makes(tmp_path):
    """A display.json naming any other file (a hostile one, in a run folder others may write)
    is damaged: the reader neither opens nor reports on that file."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 10_000)
    for named in (str(secret), "/etc/shadow", "/dev/shm/../../etc/passwd", "/tmp/edgerl-0/x"):
        pointer = {"path": named, "session": 1, "pid": os.getpid(), "height": 84, "width": 84,
                   "slots": 4, "action_meanings": ACTIONS}  # fmt: skip
        (run / "display.json").write_text(json.dumps(pointer))
        with pytest.raises(StreamError, match="is not where edgerl puts a frame stream"):
            FrameReader(run)
