"""Which weights become checkpoints/best.pt: each new best has to match the last over one round more."""

from __future__ import annotations

import numpy as np

from rlctl.roles.evaluator import BestWeights


class Weights:
    """One version's rounds, played in order; counts how many were asked for."""

    def __init__(self, *rounds: list[float]):
        self.rounds = [np.asarray(r, dtype=float) for r in rounds]
        self.played = 0

    def play(self) -> np.ndarray:
        self.played += 1
        return self.rounds[self.played - 1]


def _consider(best: BestWeights, version: int, weights: Weights, stopped=lambda: False) -> int:
    """best.consider on weights' rounds; returns the rounds they played."""
    best.consider(version, weights.play, stopped)
    return weights.played


def test_each_new_best_matches_the_last_over_one_round_more_up_to_the_cap():
    saved = []
    best = BestWeights(4, lambda version, score, rounds: saved.append((version, score, rounds)))
    assert _consider(best, 1, Weights([20, 40], [30, 30])) == 2  # the first weights: two rounds
    assert saved == [(1, 30.0, 2)]
    assert _consider(best, 2, Weights([500, 500], [500, 500], [500, 500])) == 3
    assert _consider(best, 3, Weights([500, 500], [500, 500], [500, 500], [500, 500])) == 4
    assert _consider(best, 4, Weights([500, 500], [500, 500], [500, 500], [500, 500])) == 4  # the cap
    assert saved[1:] == [(2, 500.0, 3), (3, 500.0, 4), (4, 500.0, 4)]  # equal scores: the newest weights


def test_weights_that_fall_behind_the_best_stop_playing_and_are_not_saved():
    saved = []
    best = BestWeights(10, lambda version, score, rounds: saved.append(version))
    _consider(best, 1, Weights([500, 500], [500, 500]))
    # A lucky first round, then one failed episode: the version played the whole first round at 500 and lost there.
    assert _consider(best, 2, Weights([500, 500], [500, 60], [500, 500])) == 2
    assert _consider(best, 3, Weights([499, 500])) == 1  # below the best on its first round: no more rounds
    assert saved == [1]


def test_weights_stopped_before_their_rounds_are_played_replace_the_best_only_by_beating_it():
    saved = []
    best = BestWeights(10, lambda version, score, rounds: saved.append((version, score, rounds)))
    _consider(best, 1, Weights([10], [10]))
    # The stop came during the rounds of the weights it was decided on: they beat the best, so they are the best.
    assert _consider(best, 2, Weights([500], [500], [500]), stopped=lambda: True) == 1
    assert _consider(best, 3, Weights([500], [500], [500]), stopped=lambda: True) == 1  # equal, on fewer rounds
    assert saved == [(1, 10.0, 2), (2, 500.0, 1)]


def test_one_round_picks_on_the_first_round_alone():
    saved = []
    best = BestWeights(1, lambda version, score, rounds: saved.append((version, rounds)))
    assert _consider(best, 1, Weights([5, 7])) == 1
    assert _consider(best, 2, Weights([6, 6])) == 1
    assert saved == [(1, 1), (2, 1)]
