"""More collectors never break learning: Ape-X, APPO and IMPALA on CartPole-v1 with 2, 4, 8 and 24 collectors.

    python bench/scale_collectors.py [--seeds 3] [--cap 300] [--algos apex,appo,impala] [--collectors 2,4,8,24]

Each cell changes only `topology.collectors` and `env.envs_per_collector` of the shipped job (jobs/<algo>.toml), the
envs per collector chosen so the job's total stays near 16 (2 x 8, 4 x 4, 8 x 2, 24 x 1), and runs it to the job's
own stop target (Ape-X: greedy evaluation 475 in 3 rounds in a row; APPO and IMPALA: training return 475) with the
wall cap raised to --cap. Per cell: median and worst wall seconds and env steps to the target; for Ape-X the largest
|Q| over the run (learner/q_abs_max, read back from TensorBoard) against the bound the rewards and gamma allow
(learner/q_bound: 100 for CartPole at gamma 0.99), both as the mean Q of the sampled transitions
(learner/q_mean, the figure a diverging run shows first) and the largest |Q| of any action in a batch. Targets:
every cell solves within --cap on this machine; the worst Ape-X cell's mean Q stays under 2 x the bound.

Last line: one JSON object with `<algo>_c<N>_wall_s` (median), `<algo>_c<N>_worst_wall_s`, `<algo>_c<N>_env_steps`,
`apex_c<N>_q_mean_max`, `apex_c<N>_q_abs_max`, `q_bound`, `all_solved` and `q_within_2x_bound`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _children as children  # noqa: E402
from solve_cartpole import run_rlctl  # noqa: E402

TOTAL_ENVS = 16
Q_ABS_MAX, Q_BOUND, Q_MEAN = "learner/q_abs_max", "learner/q_bound", "learner/q_mean"


def topology(text: str, collectors: int) -> str:
    """The job text with `collectors` collectors and about TOTAL_ENVS envs in all."""
    envs = max(1, round(TOTAL_ENVS / collectors))
    text, n = re.subn(r"(?m)^collectors = \d+", f"collectors = {collectors}", text)
    assert n == 1, "the job sets topology.collectors"
    text, n = re.subn(r"(?m)^envs_per_collector = \d+", f"envs_per_collector = {envs}", text)
    assert n == 1, "the job sets env.envs_per_collector"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cap", type=float, default=300.0)
    ap.add_argument("--algos", default="apex,appo,impala")
    ap.add_argument("--collectors", default="2,4,8,24")
    args = ap.parse_args()
    children.install()  # killed or failing: no rlctl run (nor its processes) outlives the bench
    counts = [int(x) for x in args.collectors.split(",")]
    out: dict = {"bench": "scale_collectors"}
    all_solved, q_ok, bounds = True, True, []
    for algo in args.algos.split(","):
        for n in counts:
            runs = []
            for seed in range(1, args.seeds + 1):
                r = run_rlctl(algo, seed, args.cap, edit=lambda t, n=n: topology(t, n), tb_max=(Q_ABS_MAX, Q_BOUND, Q_MEAN))
                runs.append(r)
                q = r["max"].get(Q_ABS_MAX)
                print(f"{algo:7s} {n:2d} collectors x {max(1, round(TOTAL_ENVS / n))} envs, seed {seed}: "
                      f"{'solved' if r['solved'] else 'NOT solved (' + str(r['exit_reason']) + ')'} "
                      f"wall {r['wall_s'] and round(r['wall_s'], 1)} s, env steps {r['env_steps']}"
                      + (f", max Q mean {r['max'][Q_MEAN]:.1f}, max |Q| {q:.1f} (bound "
                         f"{r['max'].get(Q_BOUND, float('nan')):.1f})" if q is not None else ""), flush=True)
            solved = [r for r in runs if r["solved"]]
            all_solved &= len(solved) == len(runs)
            key = f"{algo}_c{n}"
            walls = [r["wall_s"] for r in solved]
            out[f"{key}_wall_s"] = round(statistics.median(walls), 2) if len(solved) == len(runs) else None
            out[f"{key}_worst_wall_s"] = round(max(walls), 2) if len(solved) == len(runs) else None
            out[f"{key}_env_steps"] = int(statistics.median(r["env_steps"] for r in runs))
            out[f"{key}_solved"] = f"{len(solved)}/{len(runs)}"
            qs = [r["max"][Q_ABS_MAX] for r in runs if Q_ABS_MAX in r["max"]]
            if qs:
                worst_mean = max(abs(r["max"][Q_MEAN]) for r in runs if Q_MEAN in r["max"])
                bound = max(r["max"].get(Q_BOUND, 0.0) for r in runs)
                bounds.append(bound)
                out[f"{key}_q_mean_max"] = round(worst_mean, 2)
                out[f"{key}_q_abs_max"] = round(max(qs), 2)
                q_ok &= worst_mean < 2 * bound
            print(f"  {key}: {out[f'{key}_solved']} solved, median {out[f'{key}_wall_s']} s, worst "
                  f"{out[f'{key}_worst_wall_s']} s, median env steps {out[f'{key}_env_steps']}"
                  + (f", worst Q mean {out[f'{key}_q_mean_max']}, worst |Q| {out[f'{key}_q_abs_max']}" if qs
                     else ""), flush=True)
    out["q_bound"] = round(max(bounds), 2) if bounds else None
    out["all_solved"] = all_solved
    out["q_within_2x_bound"] = q_ok
    print(f"every cell solved within {args.cap:g} s: {'MET' if all_solved else 'MISSED'}; worst Ape-X Q mean under "
          f"2 x the bound: {'MET' if q_ok else 'MISSED'}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
