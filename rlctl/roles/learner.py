"""Learner role, one process per torchrun rank: Ape-X here, rollout algorithms in rollout_learner.

Always started by torchrun, so one code path serves 1 CPU process and N
nodes x M GPUs: DDP averages gradients; each rank samples from its own replay
shard(s) with `prefetch` requests in flight; rank 0 publishes weights,
checkpoints and reports learner metrics.
"""

from __future__ import annotations

import copy
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import zmq
from torch.nn.parallel import DistributedDataParallel as DDP

from rlctl import wire
from rlctl.algos.apex import targets_from_q, td_loss
from rlctl.checkpoint import save_checkpoint
from rlctl.envs import probe_space_info
from rlctl.models import build_policy, parameter_digest
from rlctl.netif import pin_collective_interface
from rlctl.optim import build_optimizer, optimizer_step
from rlctl.roles import rollout_learner
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main
from rlctl.spec import OFF_POLICY, resolved_dict
from rlctl.weights import WeightPublisher

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "discount", "keys", "weights")


def learner_device(rc: RoleContext) -> torch.device:
    """`auto`: cuda:LOCAL_RANK where a GPU is present, else CPU."""
    want = rc.job.topology.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device(f"cuda:{rc.local_rank}")
    return torch.device("cpu")


class SampleStream:
    """Pipelined sampling from this rank's shard(s): `prefetch` requests always in flight."""

    def __init__(self, net: wire.SecureContext, endpoints: list[str], batch_size: int, prefetch: int, name: str):
        self.sock = net.client(zmq.DEALER, endpoints, sndhwm=1000, rcvhwm=1000)
        self.batch_size, self.name = batch_size, name
        self.dropped = 0
        for _ in range(prefetch):
            self.request()

    def request(self) -> None:
        """Ask for one more batch."""
        wire.send(self.sock, "sample", self.name, 0, {"n": self.batch_size})

    def next(self, timeout_ms: int) -> dict[str, np.ndarray] | None:
        """The next batch, or None after `timeout_ms`; immediately re-requests so the pipe stays full."""
        while self.sock.poll(timeout_ms):
            try:
                _, msg = wire.recv(self.sock, zmq.NOBLOCK)
            except zmq.Again:
                continue
            except wire.WireError:
                self.dropped += 1
                continue
            if msg.kind != "batch" or any(f not in msg.arrays for f in BATCH_FIELDS):
                self.dropped += 1
                continue
            self.request()
            return msg.arrays
        return None

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Send new priorities back (fire and forget; the shard ignores stale keys)."""
        wire.send(self.sock, "priorities", self.name, 0, None, {"keys": keys, "priority": priorities})


def shards_for_rank(rank: int, world: int, shards: int) -> list[int]:
    """Replay shards a rank samples from: its own (r, r+world, ...), or a shared one when shards < ranks."""
    mine = list(range(rank, shards, world))
    return mine or [rank % shards]


def run(rc: RoleContext, stop: StopFlag) -> None:
    """The learner loop."""
    job, algo = rc.job, rc.job.algorithm
    device = learner_device(rc)
    pin_collective_interface()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if algo.name not in OFF_POLICY:
        rollout_learner.run(rc, stop, device)
        dist.destroy_process_group()
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(job.job.seed)
    info = probe_space_info(job.env)
    online = build_policy(job, info).to(device)
    target = copy.deepcopy(online)
    # DDP only where there is something to average: with one rank its hooks cost 25-50% of a small update.
    model = DDP(online, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else online
    # Fused Adam: one kernel for all parameters (about 20% of a small network's update on CPU).
    opt = build_optimizer("adam", online.parameters(), lr=algo.lr, eps=algo.adam_eps)

    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    endpoints = rc.endpoints["replay"]
    stream = SampleStream(net, [endpoints[i]["sample"] for i in shards_for_rank(rank, world, len(endpoints))],
                          algo.batch_size, algo.prefetch, rc.name)
    pub = WeightPublisher(net, rc.binds["weights"], rc.name, rc.weight_board) if rank == 0 else None
    version = 0

    def publish() -> None:
        pub.publish(version, online)

    def checkpoint() -> None:
        payload = {"algorithm": algo.name, "job": resolved_dict(job), "space": info.to_dict(),
                   "model": online.state_dict(), "target": target.state_dict(),
                   "optimizer": opt.state_dict(), "updates": updates, "version": version, "time": time.time()}
        save_checkpoint(rc.checkpoint_dir, payload, "latest.pt", saves, job.logging.checkpoint_keep_every)

    updates, saves = 0, 0
    if pub is not None:
        publish()
    print(f"{rc.name}: rank {rank}/{world} on {device}, {sum(p.numel() for p in online.parameters())} parameters",
          flush=True)
    next_ckpt = time.monotonic() + job.logging.checkpoint_interval_s
    loss_sum = q_sum = wait_s = 0.0
    n_sum, last_updates, last_t = 0, 0, time.monotonic()
    stop_flag = torch.zeros(1)
    while True:
        if updates % 8 == 0 and control.stop_requested():
            stop.requested = True
        if world > 1:
            # Ranks agree to stop at the same update so no rank is left inside a collective.
            stop_flag.fill_(float(bool(stop)))
            dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
            if stop_flag.item():
                break
        elif stop:
            break
        t0 = time.monotonic()
        batch = None
        while batch is None:
            batch = stream.next(100)
            if batch is None and pub is not None and pub.joined():
                publish()  # a subscriber that just joined acts with the learner's current weights at once
            # Only after a whole interval of waiting, so the heartbeat after an update (losses, rates) is not
            # replaced by this one whenever it falls due during a short wait.
            if batch is None and control.due() and time.monotonic() - t0 >= control.interval:
                control.heartbeat({"rank": rank, "learner/updates": updates, "learner/waiting": 1})
            if batch is None and world == 1 and (stop or control.stop_requested()):
                break
        if batch is None:
            break
        wait_s += time.monotonic() - t0
        obs = torch.from_numpy(np.array(batch["obs"])).to(device)
        next_obs = torch.from_numpy(np.array(batch["next_obs"])).to(device)
        actions = torch.from_numpy(np.array(batch["action"], dtype=np.int64)).to(device)
        rewards = torch.from_numpy(np.array(batch["reward"], dtype=np.float32)).to(device)
        discounts = torch.from_numpy(np.array(batch["discount"], dtype=np.float32)).to(device)
        weights = torch.from_numpy(np.array(batch["weights"], dtype=np.float32)).to(device)
        # One forward over [s; s'] through DDP: Q(s) for the loss, Q_online(s') for double-DQN action choice.
        both = model(torch.cat([obs, next_obs]))
        q, next_q_online = both[: len(obs)], both[len(obs):].detach()
        with torch.no_grad():
            y = targets_from_q(next_q_online, target(next_obs), rewards, discounts, algo.double)
        loss, td_abs = td_loss(q, actions, y, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(online.parameters(), algo.grad_clip, foreach=True)
        optimizer_step(opt)
        stream.update_priorities(np.array(batch["keys"]), td_abs.cpu().numpy().astype(np.float32))
        updates += 1
        loss_sum += float(loss.detach())
        q_sum += float(q.detach().mean())
        n_sum += 1
        if updates % algo.target_update_interval == 0:
            target.load_state_dict(online.state_dict())
        if pub is not None and updates % algo.publish_interval == 0:
            version = updates
            publish()
        now = time.monotonic()
        if rank == 0 and now >= next_ckpt:
            saves += 1
            checkpoint()
            next_ckpt = now + job.logging.checkpoint_interval_s
        if control.due(now):
            dt = max(now - last_t, 1e-9)
            rate = (updates - last_updates) / dt
            control.heartbeat({
                "rank": rank, "losses/td_loss": loss_sum / max(n_sum, 1), "learner/q_mean": q_sum / max(n_sum, 1),
                "learner/updates": updates, "learner/updates_per_s": rate, "learner/waiting": 0,
                "learner/samples_per_s": rate * algo.batch_size * world, "learner/version": version,
                "learner/sample_wait_frac": wait_s / dt, "net/dropped": stream.dropped,
            })
            loss_sum = q_sum = wait_s = 0.0
            n_sum, last_updates, last_t = 0, updates, now
    if rank == 0:
        saves += 1
        checkpoint()
        if pub is not None:
            version = max(version, updates)
            publish()
    control.send("heartbeat", {"pid": os.getpid(), "rank": rank, "metrics": {
        "rank": rank, "learner/updates": updates, "learner/version": version,
        "learner/param_digest": parameter_digest(online), "learner/final": 1}})
    print(f"{rc.name}: stopped after {updates} updates; parameter digest {parameter_digest(online)[:16]}", flush=True)
    if pub is not None:
        pub.close()
    net.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    role_main(run)
