"""The reference scores (scores.py and edgerl/data/atari_scores.csv): the 57 games, each an ALE
game edgerl can train, the human-normalised score, and where it is shown."""

from __future__ import annotations

import pytest

from edgerl.envs.scores import _table, human_normalised, reference


def test_the_table_has_the_57_games_each_a_rom_ale_ships_with_the_human_above_random():
    import ale_py

    table = _table()
    assert len(table) == 57
    assert set(table) <= set(ale_py.roms.get_all_rom_ids())
    assert all(ref.human > ref.random for ref in table.values())
    # Atari-5 (Aitchison et al. 2022) and the usual sanity set are there
    for game in ("BattleZone", "DoubleDunk", "NameThisGame", "Phoenix", "Qbert", "Breakout"):
        assert reference(f"ALE/{game}-v5") is not None, game


def test_a_score_is_normalised_between_random_play_and_the_human_tester():
    assert human_normalised("ALE/Pong-v5", -20.7) == pytest.approx(0.0)
    assert human_normalised("ALE/Pong-v5", 14.6) == pytest.approx(1.0)
    assert human_normalised("ALE/Breakout-v5", 1.7 + 0.2 * (30.5 - 1.7)) == pytest.approx(0.2)
    assert human_normalised("ALE/MsPacman-v5", 307.3) == pytest.approx(0.0)  # a two-word name
    assert human_normalised("CartPole-v1", 500) is None  # not Atari
    assert human_normalised("ALE/Combat-v5", 1) is None  # Atari, but no published reference


def test_an_evaluations_log_line_has_its_human_normalised_score():
    from edgerl.run.evaluate import Evaluation

    ev = Evaluation(100_000, 60.0, (10.0, 12.0), (900, 950), 0, 4.0)
    assert "0.32 human-normalised" in ev.describe("ALE/Breakout-v5")
    assert "human-normalised" not in ev.describe("CartPole-v1")
