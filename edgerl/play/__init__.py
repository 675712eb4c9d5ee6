"""Playing a learned policy: the episode runner, and the observers that watch it play.

:func:`play` plays episodes with a :class:`~edgerl.policies.Policy` on one environment of the game
it learned (its greedy actions, or actions sampled from the softmax of its outputs as a sampling
learner's are, with epsilon's random actions on top; seeded), measures the latency of each action
selection (observation in, action out) and reports episode returns in game points. Everything
else that happens while it plays is an :class:`Observer` it tells of each reset, step and episode:
a recording and the episode log (:mod:`edgerl.play.observers`), the live view of ``edgerl play
--render`` (:class:`edgerl.display.render.PlayRenderer`).
"""

from edgerl.play.loop import (
    MAX_TOGETHER,
    PlayOptions,
    PlayResult,
    check_matches,
    draw_offscreen,
    play,
    play_together,
)
from edgerl.play.observer import Moment, Observer

__all__ = [
    "MAX_TOGETHER",
    "Moment",
    "Observer",
    "PlayOptions",
    "PlayResult",
    "check_matches",
    "draw_offscreen",
    "play",
    "play_together",
]
