"""The replay: :class:`~edgerl.memories.replay.buffer.ReplayBuffer` (buffer.py: each frame stored
once, written by the actor, sampled on the learner's device), its sampler and n-step returns
(sampling.py), and its own save and restore beside a checkpoint (store.py, saving.py,
restore.py)."""

from edgerl.memories.replay.buffer import ReplayBuffer

__all__ = ["ReplayBuffer"]
