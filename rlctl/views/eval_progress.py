"""`rlctl eval`'s progress line on stderr while its episodes run: rewritten in place on a terminal (and erased when
they are done), elsewhere a plain line every few seconds, so a short evaluation in a script or test prints none."""

from __future__ import annotations

import sys
import time
from typing import TextIO

TERMINAL_INTERVAL_S = 0.1
PLAIN_INTERVAL_S = 5.0


class EpisodeProgress:
    """A callable `(episodes done, env steps)` for rlctl.checkpoint.evaluate_checkpoint; `close()` when done."""

    def __init__(self, episodes: int, stream: TextIO | None = None):
        self.episodes = episodes
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.interval = TERMINAL_INTERVAL_S if self.live else PLAIN_INTERVAL_S
        self.started = time.monotonic()
        self.next_at = self.started + self.interval
        self.shown = 0  # characters of the line now on the terminal

    def line(self, done: int, steps: int) -> str:
        """The progress as one line, e.g. "eval: 3/10 episodes done, 1,234 env steps, 2.1s"."""
        return (f"eval: {done}/{self.episodes} episodes done, {steps:,} env steps, "
                f"{time.monotonic() - self.started:.1f}s")

    def __call__(self, done: int, steps: int) -> None:
        now = time.monotonic()
        if now < self.next_at or done >= self.episodes:
            return
        self.next_at = now + self.interval
        text = self.line(done, steps)
        if self.live:
            self.stream.write("\r" + text.ljust(self.shown))
            self.shown = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Erase the line from the terminal (the results follow on stdout)."""
        if self.live and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0


def print_eval_result(path, result: dict, episodes: int, stochastic: bool) -> None:
    """`rlctl eval`'s result for people: the mean ± std, then one line per episode."""
    print(f"{path}: mean return {result['return_mean']:.1f} ± {result['return_std']:.1f} over {episodes} "
          f"{'sampled' if stochastic else 'greedy'} episodes (min {result['return_min']:.1f}, "
          f"max {result['return_max']:.1f})")
    for i, (ret, length) in enumerate(zip(result["returns"], result["lengths"])):
        print(f"  episode {i}: return {ret:.1f}, {length} steps"
              + (f", {result['videos'][i]}" if "videos" in result else ""))
