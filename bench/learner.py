"""PPO learner throughput: the real learner process against a bare PyTorch loop doing the same updates.

Usage: python bench/learner.py [--seconds 15] [--job jobs/ppo.toml]

The learner is started as `rlctl run` starts it (torchrun, 1 rank, `rlctl.roles.learner`) with
the job's PPO settings. The bench plays every collector of the job: it subscribes to the
weights and, as soon as version v is published, pushes one rollout of version v per
collector (synthetic CartPole-shaped data, all steps valid, so every round trains on
exactly rollout_len x envs x collectors samples). Learner samples/s = samples per round x
rounds / seconds, counted from the versions the bench receives (round trips included: they
are part of synchronous PPO).

The bare loop, in this process with one torch thread: the same ActorCritic, the same (fused) Adam,
a plain GAE over the same tensors and the same epochs x minibatches of forward, clipped
loss, backward, clip_grad_norm_ and step; no sockets, no processes.

Target: ratio >= 0.9. Last line: {"bench": "learner", "learner_samples_per_s", "bare_samples_per_s", "ratio"}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402
from rlctl.net import wire  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def synthetic_rollout(T: int, n_envs: int, info, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A rollout in the collector's layout (RolloutBuffer), every step valid and no episode ends."""
    from rlctl.algos.onpolicy.actor import RolloutBuffer

    a = RolloutBuffer(T, n_envs, info).arrays
    a["obs"][:] = rng.normal(size=a["obs"].shape)
    a["value"][:] = rng.normal(size=a["value"].shape)
    a["action"][:] = rng.integers(0, 2, size=a["action"].shape)
    a["logp"][:] = np.log(0.5)
    a["reward"][:] = 1.0
    a["terminated"][:] = False
    a["done"][:] = False
    a["valid"][:] = True
    return a


def measure_learner(job_path: Path, spec, rollouts: list[dict], seconds: float, warmup: float) -> dict:
    """Rounds per second of the real learner process fed as fast as it publishes."""
    keys = H.generate_keys()
    control_port, weights_port, rollout_port = H.free_ports(3)
    endpoints = {"control": f"tcp://127.0.0.1:{control_port}", "weights": f"tcp://127.0.0.1:{weights_port}",
                 "replay": [], "rollouts": [f"tcp://127.0.0.1:{rollout_port}"]}
    binds = {"weights": endpoints["weights"], "rollouts-0": endpoints["rollouts"][0]}
    router = H.ControlRouter(keys, endpoints["control"])
    with H.TempDir() as tmp:
        env = H.role_env("learner", 0, job_path, endpoints, keys, "bench-learner", binds, checkpoint_dir=str(tmp))
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k)  # torchrun sets them
        learner = net = None
        try:
            # torchrun and its worker share a process group: stopping the learner stops both
            learner = H.Proc("learner-0", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                           "--nproc-per-node", "1", "-m", "rlctl.roles.learner"], env, tmp, grace=30)
            net = wire.SecureContext(keys)
            sub = net.client(zmq.SUB, endpoints["weights"], subscribe=b"", rcvhwm=4)
            push = net.client(zmq.PUSH, endpoints["rollouts"][0], sndhwm=100)
            router.wait_hello(["learner-0"], 120, [learner])
            fed, marks = -1, []
            t_end = None
            while True:
                learner.check()
                if not sub.poll(5000):
                    raise TimeoutError("no weights from the learner for 5 s")
                _, msg = wire.recv(sub)
                now = time.perf_counter()
                if msg.version <= fed:
                    continue  # a re-publish of a version already fed
                fed = msg.version
                for c, r in enumerate(rollouts):
                    wire.send(push, "rollout", f"collector-{c}", msg.version, None, r)
                marks.append((now, msg.version))
                if t_end is None and now - marks[0][0] >= warmup:
                    t_end = now + seconds
                    start = (now, msg.version)
                if t_end is not None and now >= t_end:
                    break
        finally:
            if net is not None:
                net.close()
            if learner is not None:
                learner.stop(timeout=30)
            router.close()
    rounds = marks[-1][1] - start[1]
    elapsed = marks[-1][0] - start[0]
    per_round = sum(int(r["valid"].sum()) for r in rollouts)
    return {"rounds": rounds, "seconds": elapsed, "samples_per_s": rounds * per_round / elapsed}


def measure_bare(spec, rollouts: list[dict], seconds: float, warmup: float) -> dict:
    """The same PPO rounds in a plain loop: stack, GAE, epochs x minibatches of clipped-loss Adam steps."""
    import torch

    from rlctl.envs import probe_space_info
    from rlctl.algos import build_model

    torch.set_num_threads(1)
    algo = spec.algorithm
    torch.manual_seed(0)
    model = build_model(spec, probe_space_info(spec.env))
    opt = torch.optim.Adam(model.parameters(), lr=algo.lr, eps=algo.adam_eps, fused=True)  # as the learner
    batch = {k: torch.from_numpy(np.concatenate([r[k] for r in rollouts], axis=1)) for k in rollouts[0]}
    T, B = batch["reward"].shape

    def one_round() -> None:
        v, r = batch["value"], batch["reward"]
        adv = torch.zeros(T, B)
        last = torch.zeros(B)
        for t in reversed(range(T)):
            delta = r[t] + algo.gamma * v[t + 1] - v[t]
            last = delta + algo.gamma * algo.gae_lambda * last
            adv[t] = last
        ret = adv + v[:T]
        obs, act = batch["obs"][:T].reshape(T * B, -1), batch["action"].reshape(-1)
        old_logp, adv, ret = batch["logp"].reshape(-1), adv.reshape(-1), ret.reshape(-1)
        for _ in range(algo.epochs):
            for idx in torch.randperm(T * B).tensor_split(algo.minibatches):
                logits, value = model(obs[idx])
                logp_all = torch.log_softmax(logits, -1)
                logp = logp_all.gather(1, act[idx, None]).squeeze(1)
                entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
                a = adv[idx]
                a = (a - a.mean()) / (a.std() + 1e-8)
                ratio = (logp - old_logp[idx]).exp()
                pg = torch.max(-a * ratio, -a * ratio.clamp(1 - algo.clip, 1 + algo.clip)).mean()
                loss = pg + algo.vf_coef * 0.5 * (value - ret[idx]).pow(2).mean() - algo.ent_coef * entropy
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), algo.max_grad_norm)
                opt.step()

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        one_round()
    rounds, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one_round()
        rounds += 1
    elapsed = time.perf_counter() - t0
    return {"rounds": rounds, "seconds": elapsed, "samples_per_s": rounds * T * B / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", default=str(REPO / "jobs" / "ppo.toml"))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3, help="alternating learner/bare measurements; medians reported")
    args = ap.parse_args()
    H.children.install()  # killed or failing: torchrun and the learner end with the bench
    from rlctl.job.load import load_job

    job_path = Path(args.job).resolve()
    spec = load_job(job_path)
    algo = spec.algorithm
    if algo.name != "ppo":
        sys.exit(f"{job_path}: bench/learner.py measures PPO; this job runs {algo.name}")
    rng = np.random.default_rng(0)
    from rlctl.envs import probe_space_info

    info = probe_space_info(spec.env)
    rollouts = [synthetic_rollout(algo.rollout_len, spec.env.envs_per_collector, info, rng)
                for _ in range(spec.collector_count)]
    per_round = algo.rollout_len * spec.env.envs_per_collector * spec.collector_count
    print(f"PPO round: {per_round} samples, {algo.epochs} epochs x {algo.minibatches} minibatches "
          f"({spec.model.hidden} {spec.model.activation}); {args.repeats} x {args.seconds:.0f} s each side", flush=True)
    learner_rates, bare_rates = [], []
    for i in range(args.repeats):
        lr_ = measure_learner(job_path, spec, rollouts, args.seconds, args.warmup)
        bare = measure_bare(spec, rollouts, args.seconds, args.warmup)
        learner_rates.append(lr_["samples_per_s"])
        bare_rates.append(bare["samples_per_s"])
        print(f"  repeat {i + 1}: learner {lr_['samples_per_s']:9.0f} samples/s ({lr_['rounds']} rounds)   "
              f"bare {bare['samples_per_s']:9.0f} samples/s ({bare['rounds']} rounds)   "
              f"ratio {lr_['samples_per_s'] / bare['samples_per_s']:.3f}", flush=True)
    learner, bare = H.median(learner_rates), H.median(bare_rates)
    ratio = learner / bare
    print(f"median: learner {learner:.0f} samples/s, bare {bare:.0f} samples/s, ratio {ratio:.3f} "
          f"(target >= 0.9: {H.verdict(ratio, 0.9)})")
    H.emit_json({"bench": "learner", "learner_samples_per_s": round(learner, 1), "bare_samples_per_s": round(bare, 1),
                 "ratio": round(ratio, 4)})


if __name__ == "__main__":
    main()
