"""Atari throughput: a running APPO Pong job against bare in-process loops on the same machine.

    python bench/atari.py [--seconds 90] [--warmup 20] [--bare-seconds 20] [--job jobs/appo-pong.toml]

* Job: `rlctl run` of the job (PongNoFrameskip-v4, env.preset = "atari": no-op starts, frame skip 4, 84 x 84
  grayscale, 4 stacked frames; Nature-DQN convolutions; 2 collectors) for --seconds; its env steps/s and the
  learner's samples/s are read back from TensorBoard (tensorboard's own reader): the growth of the env-step and
  update counters from --warmup seconds on. Frames = env steps x frame skip.
* Bare collector loop, in this process with one torch thread: one vector env of the job's total envs (collectors x
  envs per collector) with the same preprocessing, the same network's batched forward and sampled actions per
  vector step; nothing else. Ratio = job frames/s / bare frames/s (target >= 0.8).
* Bare learner loop, in this process with one torch thread: the same ActorCritic and Adam, a plain clipped PPO
  loss over a batch of the job's shape (batch_steps samples, uint8 frames scaled on the way in), backward, clip,
  step. The job's learner is compared on its samples per busy second: learner/samples_per_s / (1 -
  learner/data_wait_frac), since a learner that waits for collectors is not slow. Target >= 0.9.
* Each bare loop runs half its --bare-seconds before the job and half after; its figure is the mean of the two.

On a GPU machine, `--device cuda` runs the job's learner and the bare learner loop on the GPU.
Last line: one JSON object with `frames_per_s`, `bare_frames_per_s`, `ratio`, `learner_ratio` and the figures behind
them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _children as children  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run_job(job: Path, seconds: float, warmup: float, device: str, samples_per_update: int) -> dict:
    """The job for `seconds`; its rates over the window from `warmup` seconds after its first metrics to its last.

    Rates come from the cumulative counters (env steps, learner updates), not from medians of the per-interval rates:
    an update of a few hundred samples every second or two makes those a few discrete values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = job.read_text()
    text = re.sub(r"(?ms)^\[job\.stop\]\n.*?(?=^\[)", f"[job.stop]\nwall_s = {seconds}\n\n", text)
    text = re.sub(r"(?m)^learner_procs = .*$", f'learner_procs = 1\ndevice = "{device}"', text)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / job.name
        path.write_text(text)
        children.run([sys.executable, "-m", "rlctl", "run", str(path), "--runs-dir", f"{tmp}/runs"],
                     capture_output=True, timeout=seconds + 180, env={**os.environ, "TERM": "dumb"},
                     grace=children.SUPERVISOR_GRACE_S)
        run_dir = next(Path(tmp, "runs").iterdir())
        acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        series = {tag: [(e.wall_time, e.value) for e in acc.Scalars(tag)] if tag in tags else []
                  for tag in ("charts/env_steps", "learner/updates", "learner/data_wait_frac")}
    t0 = min(points[0][0] for points in series.values() if points) + warmup

    def window(tag: str) -> list[tuple[float, float]]:
        return [(t, v) for t, v in series[tag] if t >= t0]

    def rate(tag: str) -> float:
        points = window(tag)
        return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) if len(points) > 1 else float("nan")

    waits = window("learner/data_wait_frac")  # each value covers the interval that ends at its time
    span = waits[-1][0] - waits[0][0] if len(waits) > 1 else float("nan")
    wait = sum(v * (t - tp) for (tp, _), (t, v) in zip(waits, waits[1:])) / span
    return {"env_steps_per_s": rate("charts/env_steps"), "samples_per_s": rate("learner/updates") * samples_per_update,
            "data_wait_frac": wait}


def bare_collector(job_spec, seconds: float) -> float:
    """Env steps/s of one vector env of the job's total envs, with the job's network acting on every step."""
    import torch

    from rlctl.algos import build_model
    from rlctl.envs import env_space_info, make_vec_env

    torch.set_num_threads(1)
    envs = job_spec.collector_count * job_spec.env.envs_per_collector
    env = make_vec_env(job_spec.env, num_envs=envs)
    info = env_space_info(env)
    model = build_model(job_spec, info)
    obs, _ = env.reset(seed=0)
    steps, t0 = 0, None
    with torch.no_grad():
        while True:
            actions, _, _ = model.act(torch.from_numpy(obs))
            obs, *_ = env.step(actions.numpy())
            if t0 is None:  # the first step pays for lazy set-up
                t0 = time.perf_counter()
                continue
            steps += envs
            if time.perf_counter() - t0 >= seconds:
                break
    env.close()
    return steps / (time.perf_counter() - t0)


def bare_learner(job_spec, seconds: float, device: str) -> float:
    """Samples/s of plain PPO updates of the job's network on batches of the job's shape."""
    import torch

    from rlctl.algos import build_model
    from rlctl.envs import probe_space_info

    torch.set_num_threads(1)
    info = probe_space_info(job_spec.env)
    algo = job_spec.algorithm
    T = algo.rollout_len
    B = algo.rollouts_per_update(job_spec.env.envs_per_collector) * job_spec.env.envs_per_collector
    dev = torch.device(device)
    model = build_model(job_spec, info).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=algo.lr, eps=algo.adam_eps)
    rng = np.random.default_rng(0)
    obs = torch.from_numpy(rng.integers(0, 255, (T * B, *info.obs_shape), dtype=np.uint8)).to(dev)
    actions = torch.from_numpy(rng.integers(0, info.n_actions, T * B)).to(dev)
    old_logp = torch.full((T * B,), -float(np.log(info.n_actions)), device=dev)
    adv, ret = torch.randn(T * B, device=dev), torch.randn(T * B, device=dev)
    samples, t0 = 0, None
    while True:
        logits, value = model(obs)
        logp = torch.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
        ratio = torch.exp(logp - old_logp)
        loss = (-torch.min(ratio * adv, ratio.clamp(1 - algo.clip, 1 + algo.clip) * adv).mean()
                + algo.vf_coef * ((value - ret) ** 2).mean())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), algo.max_grad_norm)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if t0 is None:
            t0 = time.perf_counter()
            continue
        samples += T * B
        if time.perf_counter() - t0 >= seconds:
            break
    return samples / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", default=str(REPO / "jobs" / "appo-pong.toml"))
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--bare-seconds", type=float, default=20.0, help="each bare loop, half before the job and "
                    "half after")
    ap.add_argument("--device", default="cpu", help="the learner's device (job and bare loop)")
    args = ap.parse_args()
    children.install()  # killed or failing: the run (and its processes) ends with the bench
    from rlctl.job.load import load_job

    spec = load_job(args.job)
    skip = spec.env.atari.frame_skip if spec.env.preset == "atari" else 1
    algo = spec.algorithm
    envs = spec.env.envs_per_collector
    samples_per_update = algo.rollouts_per_update(envs) * envs * algo.rollout_len
    # The bare loops run half before the job and half after: this machine's speed drifts by 10-20% over minutes
    # (other tenants), and one side alone read a drift as the job's overhead.
    half = args.bare_seconds / 2
    bare_steps_runs = [bare_collector(spec, half)]
    bare_samples_runs = [bare_learner(spec, half, args.device)]
    job = run_job(Path(args.job), args.seconds, args.warmup, args.device, samples_per_update)
    bare_steps_runs.append(bare_collector(spec, half))
    bare_samples_runs.append(bare_learner(spec, half, args.device))
    bare_steps, bare_samples = float(np.mean(bare_steps_runs)), float(np.mean(bare_samples_runs))
    frames, bare_frames = job["env_steps_per_s"] * skip, bare_steps * skip
    busy = job["samples_per_s"] / max(1e-9, 1 - job["data_wait_frac"])
    out = {"bench": "atari", "env": spec.env.id, "collectors": spec.collector_count,
           "envs_per_collector": spec.env.envs_per_collector, "device": args.device,
           "frames_per_s": round(frames, 1), "bare_frames_per_s": round(bare_frames, 1),
           "ratio": round(frames / bare_frames, 3),
           "learner_samples_per_s": round(job["samples_per_s"], 1), "learner_data_wait_frac": round(job["data_wait_frac"], 3),
           "learner_busy_samples_per_s": round(busy, 1), "bare_samples_per_s": round(bare_samples, 1),
           "learner_ratio": round(busy / bare_samples, 3),
           "bare_frames_per_s_before_after": [round(v * skip, 1) for v in bare_steps_runs],
           "bare_samples_per_s_before_after": [round(v, 1) for v in bare_samples_runs]}
    print(f"job: {frames:,.0f} frames/s ({job['env_steps_per_s']:,.0f} env steps/s), learner {job['samples_per_s']:,.0f} "
          f"samples/s, waiting for data {job['data_wait_frac']:.0%} of the time ({busy:,.0f} per busy second)")
    print(f"bare collector loop ({spec.collector_count * spec.env.envs_per_collector} envs, one process): "
          f"{bare_frames:,.0f} frames/s (before the job {bare_steps_runs[0] * skip:,.0f}, after "
          f"{bare_steps_runs[1] * skip:,.0f}); bare learner loop: {bare_samples:,.0f} samples/s (before "
          f"{bare_samples_runs[0]:,.0f}, after {bare_samples_runs[1]:,.0f})")
    print(f"ratio {out['ratio']:.2f} (target >= 0.8: {'MET' if out['ratio'] >= 0.8 else 'MISSED'}); learner ratio "
          f"{out['learner_ratio']:.2f} (target >= 0.9: {'MET' if out['learner_ratio'] >= 0.9 else 'MISSED'})")
    import json
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
