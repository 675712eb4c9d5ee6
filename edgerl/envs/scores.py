"""How an Atari score compares: the published random and human reference scores of the 57 games
(``edgerl/data/atari_scores.csv``, with its source), and the human-normalised score
``(score - random) / (human - random)``: 0 plays like a random policy, 1 like the human tester.

It is what the Atari literature reports (DQN, Rainbow, PQN, Atari-5), so a result of edgerl's
can be set beside theirs; games outside the 57 (and non-Atari environments) have none.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from edgerl.envs import ale_game
from edgerl.errors import PackagedDataError
from edgerl.files.packaged import finite, read_table


class Reference(NamedTuple):
    """A game's published reference scores."""

    random: float
    human: float

    def normalise(self, score: float) -> float:
        """``score`` as a fraction of the way from random play to the human tester's."""
        return (score - self.random) / (self.human - self.random)


@functools.cache
def _table() -> dict[str, Reference]:
    """Raises PackagedDataError where the file is damaged (a human score that is the random
    one's included: nothing could be normalised by it)."""
    rows = read_table("atari_scores.csv", {"game": str, "random": finite, "human": finite})
    table = {r["game"]: Reference(r["random"], r["human"]) for r in rows}
    for game, ref in table.items():
        if ref.human == ref.random:
            raise PackagedDataError(
                f"edgerl's table edgerl/data/atari_scores.csv is damaged ({game}'s human score "
                "is its random one); reinstall edgerl"
            )
    return table


def reference(env_id: str) -> Reference | None:
    """The reference scores of ``env_id`` (``ALE/Breakout-v5``), or None where none is
    published."""
    game = ale_game(env_id)
    return _table().get(game) if game is not None else None


def human_normalised(env_id: str, score: float) -> float | None:
    """``score`` of ``env_id`` human-normalised, or None where the game has no reference."""
    ref = reference(env_id)
    return None if ref is None else ref.normalise(score)
