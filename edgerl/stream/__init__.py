"""The frame stream: the trainer publishes every Nth frame into a small shared-memory ring.

What is shown: the agent's own view, the newest 84x84 grey frame of one environment's stack. ALE's
C++ vector env does not hand out its 210x160 colour screen, and rendering it separately would cost
an emulator step, so the viewer shows exactly what the network sees (scaled up).

Layout of the ring, a file in a directory of the trainer's user in ``/dev/shm``
(``/dev/shm/edgerl-<uid>/edgerl-<hash of the run directory>.frames``), named in
``<run_dir>/display.json``::

    header   magic "EDGERLFR", version, slots, frame height/width, actions, session id,
             writes (count of frames written; the newest is in slot (writes - 1) % slots)
    slot[i]  seq_begin, meta (step, episode, return, epsilon, action, sps, cpu, gr3d, time,
             Q-values), crc32 of meta and frame, frame bytes, seq_end

A run on vector observations (CartPole) writes only ``{"frames": false, ...}`` as its pointer, so a
viewer can say there is nothing to show.

Writing is a copy (``pwrite``) into the next slot, bracketed by the slot's sequence numbers: it
never blocks, never waits for a reader and works when no viewer exists. A reader copies a slot
and accepts it only if ``seq_begin == seq_end`` and the CRC matches; the CRC is what makes this
safe on weakly ordered CPUs (ARM), where another core may see the sequence numbers before the
frame bytes. The file is created ``0640`` with group ``display.group`` (so users in that group
can watch a service running as root) and removed when the trainer exits. The reader side, what
``edgerl view`` uses, is :mod:`edgerl.stream.reader`.

``/dev/shm`` is writable by every local account, so nothing is created there under a name
another account could take first: the ring lives in a directory the trainer's user made (0750,
the display group may enter it), and a directory at that name that is not this user's own, or
that others may write in, or a link, is refused. The file is opened without following links. A
stream that cannot be made is a warning: training goes on without it.
"""

from edgerl.stream.layout import (
    CRC,
    DAMAGE_CHECK_EVERY_S,
    HEADER,
    MAGIC,
    MAX_ACTIONS,
    META,
    POINTER_FILE,
    SEQ,
    SHM_DIR,
    STREAM_NAME,
    USER_DIR_NAME,
    VERSION,
    WRITES_OFFSET,
    FrameMeta,
    is_stream_path,
    shm_path,
    slot_size,
    stream_dir,
)
from edgerl.stream.publisher import DisplayPublisher
from edgerl.stream.ring import FrameRing

__all__ = [
    "CRC",
    "DAMAGE_CHECK_EVERY_S",
    "HEADER",
    "MAGIC",
    "MAX_ACTIONS",
    "META",
    "POINTER_FILE",
    "SEQ",
    "SHM_DIR",
    "STREAM_NAME",
    "USER_DIR_NAME",
    "VERSION",
    "WRITES_OFFSET",
    "DisplayPublisher",
    "FrameMeta",
    "FrameRing",
    "is_stream_path",
    "shm_path",
    "slot_size",
    "stream_dir",
]
