"""Learner loop of the rollout algorithms (PPO, APPO, IMPALA), one process per torchrun rank.

Each rank binds its own PULL socket; collector c sends to rank c % ranks. PPO
is synchronous: a round waits for one rollout of the current version from each
of the rank's collectors, older ones are dropped and counted, every rank runs
the same number of minibatch steps (DDP averages their gradients), and rank 0
publishes the next version. APPO and IMPALA train on whatever rollouts arrive
within `max_policy_lag` versions. Started through `rlctl.roles.learner`.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import zmq
from torch.nn.parallel import DistributedDataParallel as DDP

from rlctl import wire
from rlctl.algos.onpolicy import gae, impala_loss, ppo_loss, vtrace
from rlctl.checkpoint import save_checkpoint
from rlctl.envs import SpaceInfo, probe_space_info
from rlctl.models import ActorCritic, build_policy, parameter_digest
from rlctl.optim import build_optimizer, optimizer_step
from rlctl.roles.collector import ROLLOUT_SOCKET_BUFFER, rollout_layout
from rlctl.roles.context import ControlClient, RoleContext, StopFlag
from rlctl.spec import SYNCHRONOUS, resolved_dict
from rlctl.weights import WeightPublisher

# While waiting, rank 0 re-sends the current weights for subscribers that joined late (PUB/SUB drops what it sends
# before a subscription completes): soon at first, then backing off to once a second.
REPUBLISH_FIRST_S, REPUBLISH_MAX_S = 0.05, 1.0


class RolloutInbox:
    """This rank's PULL socket: rollouts whose layout matches the job's; malformed ones dropped and counted."""

    def __init__(self, net: wire.SecureContext, endpoint: str, info: SpaceInfo, T: int):
        # Small queues: what the learner has not taken yet pushes back on the collectors (bounding policy lag)
        # instead of piling up in socket buffers. rcvhwm=1 would never deliver a multipart message; 2 does.
        self.sock = net.server(zmq.PULL, endpoint, rcvhwm=2, rcvbuf=ROLLOUT_SOCKET_BUFFER)
        self.layout = rollout_layout(T, info)
        self.dropped = 0

    def _valid(self, msg: wire.Message) -> bool:
        if msg.kind != "rollout" or msg.arrays.keys() != self.layout.keys():
            return False
        n_envs = msg.arrays["reward"].shape[1] if msg.arrays["reward"].ndim == 2 else -1
        for name, (rows, trailing, dtype) in self.layout.items():
            a = msg.arrays[name]
            if a.dtype != dtype or a.shape != (rows, n_envs, *trailing) or n_envs < 1:
                return False
        return True

    def receive(self, timeout_ms: int, limit: int) -> list[wire.Message]:
        """Up to `limit` rollouts that arrived within `timeout_ms` (the rest stay queued, as backpressure)."""
        if not self.sock.poll(timeout_ms):
            return []
        out: list[wire.Message] = []
        for _, msg in wire.receive_waiting(self.sock):
            if msg is None or not self._valid(msg):
                self.dropped += 1
            else:
                out.append(msg)
            if len(out) >= limit:
                break
        return out


def collector_index(sender: str) -> int:
    """`collector-3` -> 3 (-1 for anything else)."""
    role, _, rank = sender.rpartition("-")
    return int(rank) if role == "collector" and rank.isdigit() else -1


def stack_rollouts(msgs: list[wire.Message], device: torch.device) -> dict[str, torch.Tensor]:
    """Concatenate rollouts along the env axis into [T(+1), B, ...] tensors on `device`."""
    return {k: torch.from_numpy(np.concatenate([m.arrays[k] for m in msgs], axis=1)).to(device)
            for k in msgs[0].arrays}


class RolloutLearner:
    """Model, optimizer and update rule of one rank; `update` turns a batch of rollouts into one new version."""

    def __init__(self, rc: RoleContext, device: torch.device, world: int, info: SpaceInfo):
        job, algo = rc.job, rc.job.algorithm
        self.algo, self.device = algo, device
        self.online: ActorCritic = build_policy(job, info).to(device)
        self.model = DDP(self.online, device_ids=[device.index] if device.type == "cuda" else None) \
            if world > 1 else self.online
        if algo.name == "impala" and algo.optimizer == "rmsprop":
            self.opt = build_optimizer("rmsprop", self.online.parameters(), lr=algo.lr, alpha=algo.rmsprop_alpha,
                                       eps=algo.adam_eps)
        else:
            # Fused: one kernel for every parameter (as the Ape-X learner; ~15% of a small network's round on CPU).
            self.opt = build_optimizer("adam", self.online.parameters(), lr=algo.lr, eps=algo.adam_eps)
        # Env steps that one version consumes over all ranks (for learning-rate annealing, identical on every rank).
        per_rollout = algo.rollout_len * job.env.envs_per_collector
        rollouts = job.collector_count if algo.name in SYNCHRONOUS else algo.rollouts_per_batch * world
        self.steps_per_version = per_rollout * rollouts
        self.generator = torch.Generator().manual_seed(job.job.seed * 1000 + rc.rank)

    def set_lr(self, version: int) -> float:
        """Linear annealing to 0 over `lr_anneal_steps` env steps (constant when unset)."""
        lr = self.algo.lr
        if self.algo.lr_anneal_steps:
            lr *= max(1.0 - version * self.steps_per_version / self.algo.lr_anneal_steps, 0.0)
        for group in self.opt.param_groups:
            group["lr"] = lr
        return lr

    def _step(self, loss: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.algo.max_grad_norm, foreach=True)
        optimizer_step(self.opt)

    def _forward_all(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Heads and values of [T+1, B, ...] observations, through DDP: ([T+1, B, A], [T+1, B])."""
        rows, b = obs.shape[:2]
        head, value = self.model(obs.reshape(rows * b, *obs.shape[2:]))
        return head.reshape(rows, b, -1), value.reshape(rows, b)

    def update(self, r: dict[str, torch.Tensor]) -> dict[str, float]:
        """Train on one batch of rollouts; returns the loss statistics."""
        algo = self.algo
        rewards = r["reward"] * algo.reward_scale
        T, B = rewards.shape
        actions = r["action"]
        if algo.name == "impala":
            head, values = self._forward_all(r["obs"])
            logp, entropy = self.online.log_prob_entropy(head[:T].reshape(T * B, -1), actions.reshape(T * B, -1))
            logp, entropy = logp.reshape(T, B), entropy.reshape(T, B)
            with torch.no_grad():
                vs, pg_adv = vtrace(r["logp"], logp.detach(), rewards, values.detach(), r["terminated"], r["done"],
                                    r["valid"], algo.gamma, algo.rho_bar, algo.c_bar)
            loss, stats = impala_loss(logp, entropy, values[:T], vs, pg_adv, r["valid"].float(), algo.vf_coef,
                                      algo.ent_coef)
            self._step(loss)
            return {k: float(v) for k, v in stats.items()}
        # PPO and APPO.
        with torch.no_grad():
            if algo.name == "appo" and algo.vtrace:
                head, values = self._forward_all(r["obs"])
                logp_now, _ = self.online.log_prob_entropy(head[:T].reshape(T * B, -1), actions.reshape(T * B, -1))
                returns, adv = vtrace(r["logp"], logp_now.reshape(T, B), rewards, values, r["terminated"], r["done"],
                                      r["valid"], algo.gamma, algo.rho_bar, algo.c_bar)
                old_values = values[:T]
            else:
                adv, returns = gae(rewards, r["value"], r["terminated"], r["done"], r["valid"], algo.gamma,
                                   algo.gae_lambda)
                old_values = r["value"][:T]
        keep = r["valid"].reshape(-1).nonzero().squeeze(1)
        flat = {"obs": r["obs"][:T].reshape(T * B, *r["obs"].shape[2:])[keep],
                "action": actions.reshape(T * B, *actions.shape[2:])[keep], "logp": r["logp"].reshape(-1)[keep],
                "adv": adv.reshape(-1)[keep], "ret": returns.reshape(-1)[keep], "v": old_values.reshape(-1)[keep]}
        n = len(keep)
        totals: dict[str, torch.Tensor] = {}  # summed as tensors: one conversion per round, not per step
        counts: dict[str, int] = {}
        for epoch in range(algo.epochs):
            last_epoch = epoch == algo.epochs - 1  # statistics are of the last pass (as CleanRL reports them)
            perm = torch.randperm(n, generator=self.generator).to(self.device)
            # tensor_split always gives `minibatches` parts, so every rank takes the same number of DDP steps.
            for idx in perm.tensor_split(algo.minibatches):
                if len(idx) == 0:
                    # Nothing here on this rank, but its peers wait for this step's all-reduce: a zero loss.
                    self._step(sum(p.sum() * 0.0 for p in self.online.parameters()))
                    continue
                head, value = self.model(flat["obs"][idx])
                logp, entropy = self.online.log_prob_entropy(head, flat["action"][idx])
                adv_mb = flat["adv"][idx]
                if algo.norm_adv and len(idx) > 1:
                    adv_mb = (adv_mb - adv_mb.mean()) / (adv_mb.std() + 1e-8)
                loss, stats = ppo_loss(logp, flat["logp"][idx], adv_mb, value, flat["v"][idx], flat["ret"][idx],
                                       entropy, algo.clip, algo.value_clip, algo.vf_coef, algo.ent_coef,
                                       diagnostics=last_epoch)
                self._step(loss)
                if last_epoch:
                    for k, v in stats.items():
                        totals[k] = totals[k] + v if k in totals else v
                        counts[k] = counts.get(k, 0) + 1
        return {k: float(v) / counts[k] for k, v in totals.items()}


def run(rc: RoleContext, stop: StopFlag, device: torch.device) -> None:
    """The rollout learner loop (the process group is already initialised)."""
    job, algo = rc.job, rc.job.algorithm
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(job.job.seed)  # identical initial parameters on every rank
    info = probe_space_info(job.env)
    learner = RolloutLearner(rc, device, world, info)
    online = learner.online
    synchronous = algo.name in SYNCHRONOUS
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    inbox = RolloutInbox(net, rc.binds[f"rollouts-{rank}"], info, algo.rollout_len)
    pub = WeightPublisher(net, rc.binds["weights"], rc.name, rc.weight_board) if rank == 0 else None
    mine = {c for c in range(job.collector_count) if c % world == rank}
    version, saves, stale = 0, 0, 0
    chain = ""  # hash chain of this rank's parameter digests after every version (compared across ranks)
    last_publish, republish_s = 0.0, REPUBLISH_FIRST_S

    def publish(again: bool = False) -> None:
        nonlocal last_publish, republish_s
        if pub is not None:
            pub.publish(version, online)
            last_publish = time.monotonic()
            republish_s = min(2 * republish_s, REPUBLISH_MAX_S) if again else REPUBLISH_FIRST_S

    def republish_if_due() -> None:
        """While waiting: send the current weights again to subscribers that just joined, and now and then in
        case a subscription is still on its way."""
        if pub is not None and (pub.joined() or time.monotonic() - last_publish >= republish_s):
            publish(again=True)

    def checkpoint() -> None:
        payload = {"algorithm": algo.name, "job": resolved_dict(job), "space": info.to_dict(),
                   "model": online.state_dict(), "optimizer": learner.opt.state_dict(), "updates": version,
                   "version": version, "time": time.time()}
        save_checkpoint(rc.checkpoint_dir, payload, "latest.pt", saves, job.logging.checkpoint_keep_every)

    waiting = zmq.Poller()
    waiting.register(inbox.sock, zmq.POLLIN)
    if pub is not None:
        waiting.register(pub.sock, zmq.POLLIN)

    def gather() -> list[wire.Message] | None:
        """This version's batch: PPO one current rollout per own collector; else enough within the lag bound."""
        nonlocal stale
        got: dict[int, wire.Message] = {}
        batch: list[wire.Message] = []
        since = time.monotonic()
        while True:
            if stop or control.stop_requested():
                stop.requested = True
                return None
            need = len(mine) - len(got) if synchronous else algo.rollouts_per_batch - len(batch)
            waiting.poll(50)  # rollouts, or (rank 0) a new subscriber to welcome with the current weights
            for msg in inbox.receive(0, max(need, 1)):
                lag = version - msg.version
                c = collector_index(msg.sender)
                if synchronous:
                    if lag == 0 and c in mine:
                        got[c] = msg
                    else:
                        stale += 1  # from an older version (a collector that fell behind or restarted)
                elif 0 <= lag <= algo.max_policy_lag:
                    batch.append(msg)
                else:
                    stale += 1
            if synchronous and len(got) == len(mine):
                return [got[c] for c in sorted(got)]
            if not synchronous and len(batch) >= algo.rollouts_per_batch:
                return batch
            republish_if_due()
            # Only after a whole interval of waiting: a due heartbeat sent from here in a round's ordinary wait took
            # the place of the one after the update, which carries the losses and rates (a fast run reported none).
            if control.due() and time.monotonic() - since >= control.interval:
                control.heartbeat({"rank": rank, "learner/updates": version, "learner/waiting": 1,
                                   "learner/rollouts_dropped": stale, "net/dropped": inbox.dropped})

    publish()
    print(f"{rc.name}: {algo.name} rank {rank}/{world} on {device}, {sum(p.numel() for p in online.parameters())} "
          f"parameters, collectors {sorted(mine)}", flush=True)
    next_ckpt = time.monotonic() + job.logging.checkpoint_interval_s
    last_t, last_version, samples, lags, stats = time.monotonic(), 0, 0, [], {}
    stop_flag = torch.zeros(1)
    wait_s = 0.0
    while True:
        t0 = time.monotonic()
        msgs = gather()
        if world > 1:
            # Ranks agree to stop at the same version so no rank is left inside a collective. Asynchronously:
            # while rank 0 waits here for a rank whose collector has not seen the weights yet (its subscription
            # completed after the last publication), it must keep re-publishing them, or both wait forever.
            stop_flag.fill_(float(msgs is None))
            work = dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX, async_op=True)
            while not work.is_completed():
                republish_if_due()
                time.sleep(0.0005)
            work.wait()
            if stop_flag.item():
                break
        elif msgs is None:
            break
        wait_s += time.monotonic() - t0
        lags.extend(version - m.version for m in msgs)
        batch = stack_rollouts(msgs, device)
        samples += int(batch["valid"].sum())
        lr = learner.set_lr(version)
        stats = learner.update(batch)
        version += 1
        publish()
        if world > 1:
            chain = hashlib.sha256((chain + parameter_digest(online)).encode()).hexdigest()
        now = time.monotonic()
        if rank == 0 and now >= next_ckpt:
            saves += 1
            checkpoint()
            next_ckpt = now + job.logging.checkpoint_interval_s
        if control.due(now):
            dt = max(now - last_t, 1e-9)
            control.heartbeat({
                "rank": rank, **stats, "learner/updates": version, "learner/version": version,
                "learner/updates_per_s": (version - last_version) / dt, "learner/samples_per_s": samples * world / dt,
                "learner/waiting": 0,
                "learner/policy_lag_mean": float(np.mean(lags)) if lags else 0.0, "learner/rollouts_dropped": stale,
                "learner/lr": lr, "learner/rollout_wait_frac": wait_s / dt, "learner/digest_chain": chain,
                "net/dropped": inbox.dropped})
            last_t, last_version, samples, lags, wait_s = now, version, 0, [], 0.0
    if rank == 0:
        saves += 1
        checkpoint()
        publish()
    control.send("heartbeat", {"pid": os.getpid(), "rank": rank, "metrics": {
        "rank": rank, "learner/updates": version, "learner/version": version, "learner/rollouts_dropped": stale,
        "learner/param_digest": parameter_digest(online), "learner/digest_chain": chain, "learner/final": 1}})
    print(f"{rc.name}: stopped at version {version}; parameter digest {parameter_digest(online)[:16]}", flush=True)
    if pub is not None:
        pub.close()
    net.close()
