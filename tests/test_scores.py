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
    from edgerl.report.evaluate import Evaluation

    ev = Evaluation(100_000, 60.0, (10.0, 12.0), (900, 950), 0, 4.0)
    assert "0.32 human-normalised" in ev.describe("ALE/Breakout-v5")
    assert "human-normalised" not in ev.describe("CartPole-v1")


def test_es_hour_is_the_papers_one_hour_score_of_a_game_it_reports():
    """OpenAI ES after one hour on 720 CPUs (Salimans et al. 2017, Table 3): the figures issue
    57 quotes, each game one of the 57, and none for a game the paper left out."""
    from edgerl.envs.scores import _es_hour, es_hour

    assert set(_es_hour()) <= set(_table()) and len(_es_hour()) == 45
    quoted = {"BattleZone": 16_600, "DoubleDunk": 0.2, "NameThisGame": 4_503, "Qbert": 147.5}
    quoted |= {"Boxing": 49.8, "Frostbite": 370, "Asterix": 1_440, "Pong": 21}
    for game, score in quoted.items():
        assert es_hour(f"ALE/{game}-v5") == score, game
    assert es_hour("ALE/Phoenix-v5") is None and es_hour("CartPole-v1") is None


def test_the_atari5_regression_predicts_published_medians():
    """The summary score of Aitchison et al. from five games' raw scores: the human tester's
    scores give the regression's 85% (its weights sum to 0.965, no intercept); random play or
    worse, 0; a game missing, none. And IQN's five published scores (Dabney et al. 2018, as in
    the Atari-5 dataset) predict its published 57-game median, 218%, within the paper's 10%."""
    from edgerl.envs.scores import atari5_median, atari5_weights

    assert sum(atari5_weights().values()) == pytest.approx(0.965, abs=1e-3)
    five = ["BattleZone", "DoubleDunk", "NameThisGame", "Phoenix", "Qbert"]
    ids = [f"ALE/{g}-v5" for g in five]
    human = dict(zip(ids, [37_187.5, -16.4, 8_049.0, 7_242.6, 13_455.0], strict=True))
    assert atari5_median(human) == pytest.approx(0.85, abs=0.005)
    random = dict(zip(ids, [2_360.0, -18.6, 2_292.3, 761.4, 163.9], strict=True))
    assert atari5_median(random) == pytest.approx(0.0)
    assert atari5_median({k: v - 1000 for k, v in random.items()}) == pytest.approx(0.0)
    assert atari5_median({k: v for k, v in human.items() if "Qbert" not in k}) is None
    iqn = dict(zip(ids, [42_244.0, 5.6, 22_682.0, 56_599.0, 25_750.0], strict=True))
    assert atari5_median(iqn | {"ALE/Pong-v5": 21.0}) == pytest.approx(2.18, rel=0.10)


def test_a_damaged_atari5_table_is_one_sentence_not_a_wrong_prediction(tmp_path, monkeypatch):
    """A weight lost from edgerl/data/atari5.csv would predict a lower median without a word:
    the table must weigh five of the 57 games, or reading it says which file to reinstall."""
    from edgerl.envs import scores
    from edgerl.errors import PackagedDataError
    from edgerl.files import packaged

    data = tmp_path / "data"
    data.mkdir()
    for name in ("atari5.csv", "atari_scores.csv"):
        text = packaged.DATA.joinpath(name).read_text()
        (data / name).write_text(
            text.replace("qbert,0.08", "#", 1) if name == "atari5.csv" else text
        )
    monkeypatch.setattr(packaged, "DATA", data)
    scores.atari5_weights.cache_clear()
    try:
        with pytest.raises(PackagedDataError, match=r"edgerl/data/atari5.csv is damaged"):
            scores.atari5_median({"ALE/Qbert-v5": 1.0})
    finally:
        scores.atari5_weights.cache_clear()
