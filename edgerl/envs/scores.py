"""How an Atari score compares: the published random and human reference scores of the 57 games
(``edgerl/data/atari_scores.csv``, with its source), and the human-normalised score
``(score - random) / (human - random)``: 0 plays like a random policy, 1 like the human tester.

It is what the Atari literature reports (DQN, Rainbow, PQN, Atari-5), so a result of edgerl's
can be set beside theirs; games outside the 57 (and non-Atari environments) have none. Beside it:
OpenAI ES's score after one hour on 720 CPUs (``es_hour.csv``), the nearest published one-hour
figure, and the Atari-5 summary score (``atari5.csv``): the 57-game median that five games'
scores predict.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
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


@functools.cache
def _es_hour() -> dict[str, float]:
    rows = read_table("es_hour.csv", {"game": str, "score": finite})
    return {r["game"]: r["score"] for r in rows}


def es_hour(env_id: str) -> float | None:
    """OpenAI ES's score on ``env_id`` after one hour of training on 720 CPUs (Salimans et al.
    2017), or None where the paper reports none."""
    game = ale_game(env_id)
    return _es_hour().get(game) if game is not None else None


@functools.cache
def atari5_weights() -> dict[str, float]:
    """The Atari-5 regression's weight of each of its five games, by ALE ROM name."""
    rows = read_table("atari5.csv", {"game": str, "weight": finite})
    weights = {r["game"]: r["weight"] for r in rows}
    if len(weights) != 5 or not set(weights) <= set(_table()):
        raise PackagedDataError(
            "edgerl's table edgerl/data/atari5.csv is damaged (it must weigh five of the 57 "
            "games); reinstall edgerl"
        )
    return weights


def atari5_median(scores: Mapping[str, float]) -> float | None:
    """The median human-normalised score over the 57 games that the Atari-5 regression
    predicts from ``scores`` (env id -> score; the five games' ids among them), as a fraction
    like ``human_normalised``'s; None unless all five are given. A game below random play
    counts as random play, as in the paper."""
    by_game = {ale_game(env_id): score for env_id, score in scores.items()}
    weights = atari5_weights()
    if not set(weights) <= set(by_game):
        return None
    log_median = sum(
        weight * math.log10(1 + max(100 * _table()[game].normalise(by_game[game]), 0.0))
        for game, weight in weights.items()
    )
    return (10**log_median - 1) / 100
