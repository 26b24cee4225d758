"""The periodic metrics line of a process's log: every `logging.log_interval_s`, one compact line of the figures its
heartbeats carry (rates, returns, losses), so that `rlctl logs` tells how a run goes, as SB3's logger table and
Sample Factory's FPS lines do:

    metrics env_steps=12345 env_steps/s=4100 episodes=31 return_mean=23.5 wait_frac=0.12

Light (metric names only): torch-free central collectors import it.
"""

from __future__ import annotations

import math
import time

from rlctl import metric_names as M

PREFIX = "metrics "
# What a line shows, in this order, where a heartbeat carries it; the label is the name without its namespace, with
# "_per_s" as "/s", unless given here.
SHOWN = (
    M.COLLECTOR_ENV_STEPS, M.ENV_STEPS_PER_S, M.COLLECTOR_WAIT_FRAC, M.COLLECTOR_WEIGHT_VERSION_LAG,
    M.COLLECTOR_INFERENCE_MS,
    M.UPDATES, M.UPDATES_PER_S, M.SAMPLES_PER_S, M.TD_LOSS, M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.APPROX_KL,
    M.CLIPFRAC, M.Q_MEAN, M.GRAD_NORM, M.DATA_WAIT_FRAC, M.POLICY_LAG_MEAN, M.ROLLOUTS_DROPPED,
    M.REPLAY_SIZE, M.REPLAY_INSERT_PER_S, M.REPLAY_SAMPLED_PER_S,
    M.EVAL_RETURN_MEAN, M.EVAL_VERSION,
    M.INFERENCE_REQUESTS_PER_S, M.INFERENCE_BATCH_SIZE_MEAN, M.INFERENCE_LATENCY_P50, M.INFERENCE_LATENCY_P99,
    M.RELAY_WEIGHT_VERSION, M.RELAY_VERSIONS_PER_S,
)
LABELS = {M.EVAL_RETURN_MEAN: "eval_return", M.EVAL_VERSION: "eval_version", M.INFERENCE_LATENCY_P50: "latency_ms_p50",
          M.INFERENCE_LATENCY_P99: "latency_ms_p99"}
SHOWN_IF_NONZERO = (M.NET_DROPPED, M.NET_REFUSED, M.NONFINITE_UPDATES)  # faults: only when there are some


def label(name: str) -> str:
    """How a line names a metric: "charts/env_steps_per_s" -> "env_steps/s"."""
    return LABELS.get(name) or name.rsplit("/", 1)[-1].replace("_per_s", "/s")


def number(value: float) -> str:
    """A figure in a few characters: whole numbers as they are, 4100.3 as 4100, 23.46 as 23.5, 0.01234 as 0.0123."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e15):
        return str(int(value))
    if not math.isfinite(value):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def format_line(metrics: dict, returns: list[float]) -> str:
    """The line for the latest heartbeat's figures and the episode returns that ended since the last line (a
    collector's episodes and their mean return follow its env-step rate)."""
    parts = []
    for name in SHOWN:
        if _real(metrics.get(name)):
            parts.append(f"{label(name)}={number(metrics[name])}")
        if name == M.ENV_STEPS_PER_S and M.COLLECTOR_ENV_STEPS in metrics:
            parts.append(f"episodes={len(returns)}")
            if returns:
                parts.append(f"return_mean={number(sum(returns) / len(returns))}")
    parts += [f"{label(name)}={number(metrics[name])}" for name in SHOWN_IF_NONZERO
              if _real(metrics.get(name)) and metrics[name]]
    return PREFIX + " ".join(parts)


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MetricsLine:
    """Collects what heartbeats carry and gives the line when one is due (every `interval_s`, from the start)."""

    def __init__(self, interval_s: float, now: float | None = None):
        self.interval_s = interval_s
        self.next_at = (time.monotonic() if now is None else now) + interval_s
        self.returns: list[float] = []
        self.unsaid: dict | None = None  # the latest figures offered since the last line

    def offer(self, metrics: dict, now: float | None = None) -> str | None:
        """Take one heartbeat's figures; the line when it is due, else None."""
        self.returns.extend(r for r in metrics.get(M.EPISODE_RETURNS, ()) if isinstance(r, (int, float)))
        self.unsaid = metrics
        now = time.monotonic() if now is None else now
        if now < self.next_at:
            return None
        self.next_at = now + self.interval_s
        return self.flush()

    def flush(self) -> str | None:
        """The line of the figures offered since the last line, if any (a process's last words: a run shorter than
        the interval still logs its figures)."""
        if self.unsaid is None:
            return None
        line, self.returns, self.unsaid = format_line(self.unsaid, self.returns), [], None
        return line
