"""explore.py: one epsilon-greedy for training's actor, evaluations and play."""

from __future__ import annotations

import numpy as np
import pytest

from edgerl.learners.explore import epsilon_greedy, with_exploration


@pytest.mark.parametrize("epsilon", [0.0, 0.25, 1.0])
def test_a_greedy_action_is_replaced_at_the_rate_asked_by_any_action(epsilon):
    rng = np.random.default_rng(0)
    greedy = np.full(20_000, 5, dtype=np.int64)
    actions = with_exploration(greedy, epsilon, 6, rng)
    assert actions.dtype == np.int64 and actions.shape == greedy.shape
    random = actions != 5  # a random draw of 5 counts as greedy: 5/6 of draws are seen
    assert random.mean() == pytest.approx(epsilon * 5 / 6, abs=0.02)
    if epsilon == 1.0:
        assert set(np.unique(actions)) == set(range(6))


def test_epsilon_greedy_from_q_values_and_all_random_before_any():
    rng = np.random.default_rng(1)
    q = np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 0.0]])
    assert epsilon_greedy(q, 0.0, 3, 2, rng).tolist() == [1, 0]
    drawn = np.concatenate([epsilon_greedy(None, 0.0, 3, 2, rng) for _ in range(200)])
    assert set(drawn.tolist()) == {0, 1, 2}  # no Q-values yet: every action random
