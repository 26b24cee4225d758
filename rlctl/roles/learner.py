"""The learner shell, one process per torchrun rank, for every algorithm.

Always started by torchrun, so one code path serves 1 CPU process and N nodes x M GPUs. The shell owns everything
that is not the algorithm's math: process group and DDP, device, seeding, the data source of the algorithm's data
path (rlctl.datapaths), stop agreement across ranks, weight publication (rank 0), checkpoints (rank 0) and
heartbeats. The algorithm's `LearnerCore` (rlctl.algos) turns each batch into one update.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import zmq
from torch.nn.parallel import DistributedDataParallel as DDP

from rlctl import events
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.algos.base import LearnerCore, LearnerSetup, UpdateResult
from rlctl.checkpoint import CheckpointError, newest_checkpoint, save_checkpoint
from rlctl.envs import probe_space_info
from rlctl.optim import keep_optimizer_settings, optimizer_settings
from rlctl.models import parameter_digest
from rlctl.launch.netif import pin_collective_interface
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main, set_torch_threads
from rlctl.job.entry_points import one_line
from rlctl.job.resolved import resolved_dict
from rlctl.net.weights import PUBLISHER_IO_THREADS, WeightPublisher

# While waiting, rank 0 re-sends the current weights for subscribers that joined late (PUB/SUB drops what it sends
# before a subscription completes): soon at first, then backing off to once a second.
REPUBLISH_FIRST_S, REPUBLISH_MAX_S = 0.05, 1.0
STOP_CHECK_EVERY = 8  # updates between looks at the control socket while data keeps coming
# |Q| this many times past what the rewards and gamma allow is a run diverging, not an estimate overshooting: a
# batch's largest |Q| reached 4.5 x the bound in CartPole runs of 24 collectors that went on to solve; the diverged
# runs this guards against went to 1e5-1e7 x.
DIVERGENCE_FACTOR = 10.0


def divergence(stats: dict[str, float]) -> str | None:
    """Why a learner's figures say it is diverging (non-finite values, |Q| far past its bound), or None."""
    bad = sorted(k for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v))
    if bad:
        return f"non-finite {', '.join(bad)}"
    q, bound = stats.get(M.Q_ABS_MAX), stats.get(M.Q_BOUND)
    if q is not None and bound and q > DIVERGENCE_FACTOR * bound:
        return f"|Q| {q:.3g} is over {DIVERGENCE_FACTOR:g} x the bound {bound:.3g} that the rewards and gamma allow"
    return None


def learner_device(rc: RoleContext) -> torch.device:
    """`auto`: cuda:LOCAL_RANK where a GPU is present, else CPU."""
    want = rc.job.topology.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device(f"cuda:{rc.local_rank}")
    return torch.device("cpu")


def build_core(job, info, device: torch.device, rank: int = 0, world: int = 1) -> LearnerCore:
    """The job's learner core; with world > 1 it trains through DDP (only then: with one rank DDP's hooks cost
    25-50% of a small update)."""
    def distribute(module: torch.nn.Module) -> torch.nn.Module:
        if world == 1:
            return module
        return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)

    return job.algorithm_entry.load("learner")(LearnerSetup(job, info, device, rank, world, distribute))


@dataclass
class ReportWindow:
    """The updates between two heartbeats: when it began, the update count then, and what they summed."""

    started: float
    first_update: int
    updates: int = 0
    samples: int = 0
    wait_s: float = 0.0
    totals: dict = field(default_factory=dict)

    def add(self, result: UpdateResult) -> None:
        """Count one update; its statistics summed as they come (tensors too: converted once per heartbeat)."""
        self.updates += 1
        self.samples += result.samples
        for k, v in result.stats.items():
            self.totals[k] = self.totals[k] + v if k in self.totals else v


class LearnerShell:
    """One rank's loop: gather a batch, agree on stopping, update, publish, checkpoint, report."""

    def __init__(self, rc: RoleContext, stop: StopFlag, device: torch.device):
        job = rc.job
        self.rc, self.stop, self.job = rc, stop, job
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.threads = set_torch_threads()
        torch.manual_seed(job.job.seed)  # identical initial parameters on every rank
        self.info = probe_space_info(job.env)
        self.device = device
        self.core = build_core(job, self.info, device, self.rank, self.world)
        self.model = self.core.model
        self.net = wire.SecureContext(rc.keys, PUBLISHER_IO_THREADS if self.rank == 0 else 1)
        self.control = ControlClient(self.net, rc)
        self.source = job.data_path.learner_source(self.net, rc, job, self.info, self.rank, self.world, device)
        self.pub = WeightPublisher(self.net, rc.binds["weights"], rc.name, rc.weight_board,
                                   bulk=rc.binds.get("weights_bulk")) if self.rank == 0 else None
        self.waiting = zmq.Poller()  # data, or (rank 0) a new subscriber to welcome with the current weights
        self.waiting.register(self.source.sock, zmq.POLLIN)
        if self.pub is not None:
            self.waiting.register(self.pub.sock, zmq.POLLIN)
        self.updates = self.version = self.saves = 0
        self.chain = ""  # hash chain of this rank's parameter digests after every update (compared across ranks)
        self.last_publish, self.republish_s = 0.0, REPUBLISH_FIRST_S
        self.diverging = False
        self.restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's restarts of the ranks
        self.restore()
        self.restored_updates = self.updates

    # -- weights and checkpoints --------------------------------------------
    def publish(self, again: bool = False) -> None:
        """Rank 0: send the current version to collectors and evaluator."""
        if self.pub is not None:
            self.pub.publish(self.version, self.model)
            self.last_publish = time.monotonic()
            self.republish_s = min(2 * self.republish_s, REPUBLISH_MAX_S) if again else REPUBLISH_FIRST_S

    def republish_if_due(self) -> None:
        """While waiting: the current weights again to subscribers that just joined, and now and then in case a
        subscription is still on its way."""
        if self.pub is not None and (self.pub.joined() or time.monotonic() - self.last_publish >= self.republish_s):
            self.publish(again=True)

    def checkpoint(self) -> None:
        """Rank 0: model, the core's state (optimizer, target, counters), the shell's counters and RNG state."""
        self.saves += 1
        job = self.job
        payload = {"algorithm": job.algorithm.name, "job": resolved_dict(job), "space": self.info.to_dict(),
                   "model": self.model.state_dict(), "core": self.core.state_dict(), "updates": self.updates,
                   "version": self.version, "saves": self.saves, "rng": torch.get_rng_state(), "time": time.time()}
        save_checkpoint(self.rc.checkpoint_dir, payload, "latest.pt", self.saves, job.logging.checkpoint_keep_every)

    def restore(self) -> None:
        """Continue from the run's newest checkpoint, if any (after a rank died, or `rlctl run --resume`): rank 0
        reads it and every rank takes the same state, so DDP's replicas stay identical."""
        payload = None
        if self.rank == 0 and self.rc.checkpoint_dir:
            payload = newest_checkpoint(self.rc.checkpoint_dir)
            if payload is not None and payload.get("algorithm") != self.job.algorithm.name:
                raise CheckpointError(f"{payload['path']} holds {payload.get('algorithm')!r}, not "
                                      f"{self.job.algorithm.name!r}")
        if self.world > 1:
            box = [payload]
            dist.broadcast_object_list(box, src=0)
            payload = box[0]
        if payload is None:
            return
        try:
            self.model.load_state_dict(payload["model"])
            settings = optimizer_settings(self.core.opt)
            self.core.load_state_dict(payload["core"])
            # The job's settings, not the checkpoint's: a loaded optimizer state carries the learning rate (and
            # eps, ...) it was saved with, and a job changed since (PBT's explore step) must win.
            keep_optimizer_settings(self.core.opt, settings)
            self.updates, self.version = int(payload["updates"]), int(payload["version"])
            self.saves = int(payload.get("saves", 0))
            if isinstance(payload.get("rng"), torch.Tensor):
                torch.set_rng_state(payload["rng"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{payload.get('path')}: does not fit this job's learner: {exc}") from None
        events.emit("resumed", process=self.rc.name, path=str(payload.get("path")), update=self.updates,
                    version=self.version, restart=self.restarts, lr=float(self.core.opt.param_groups[0]["lr"]))

    # -- the loop ------------------------------------------------------------
    def gather(self) -> dict | None:
        """The next batch, or None once this rank is told to stop."""
        since = time.monotonic()
        while True:
            batch = self.source.take(self.version)
            if batch is not None:
                return batch
            if self.stop or self.control.stop_requested():
                self.stop.requested = True
                return None
            self.republish_if_due()
            # Only after a whole interval of waiting: a due heartbeat sent from here in a round's ordinary wait took
            # the place of the one after the update, which carries the losses and rates (a fast run reported none).
            if self.control.due() and time.monotonic() - since >= self.control.interval:
                self.control.heartbeat({"rank": self.rank, M.WORLD: self.world, M.UPDATES: self.updates, M.WAITING: 1,
                                        M.VERSION: self.version, M.LEARNER_RESTARTS: self.restarts,
                                        **self.source.metrics()})
            self.waiting.poll(50)

    def agree_to_stop(self, stopping: bool) -> bool:
        """All ranks stop at the same update, so none is left inside a collective. Asynchronously: while rank 0
        waits here for a rank whose collectors have not seen the weights yet (their subscription completed after
        the last publication), it must keep re-publishing them, or both wait forever."""
        if self.world == 1:
            return stopping
        flag = torch.tensor([float(stopping)])
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        while not work.is_completed():
            self.republish_if_due()
            time.sleep(0.0001)
        work.wait()
        return bool(flag.item())

    def run(self) -> None:
        """Update until the stop; then a last checkpoint and the final heartbeat. In an elastic world a collective
        that fails (a peer's node gone) ends the rank, and torchrun re-forms the group from the newest checkpoint:
        rank 0 first saves the last update, so the group goes on from there rather than from the last interval's."""
        try:
            self.loop()
        except RuntimeError as exc:  # gloo's and NCCL's errors (DistBackendError is one)
            if self.rank == 0 and self.world > 1 and self.job.elastic_learners:
                self.rc.say(f"the learner group broke after update {self.updates} ({one_line(exc)[:200]}); saving "
                            "it for the group that re-forms")
                self.checkpoint()
            raise

    def loop(self) -> None:
        """Publish, then gather, agree and update until the stop."""
        self.publish()
        self.rc.say(f"{self.job.algorithm.name} rank {self.rank}/{self.world} on {self.device} "
                    f"({self.threads} torch thread{'s' if self.threads > 1 else ''}), "
                    f"{sum(p.numel() for p in self.model.parameters())} parameters")
        next_ckpt = time.monotonic() + self.job.logging.checkpoint_interval_s
        window = ReportWindow(time.monotonic(), self.updates)
        while True:
            if self.updates % STOP_CHECK_EVERY == 0 and self.control.stop_requested():
                self.stop.requested = True
            t0 = time.monotonic()
            batch = None if self.stop else self.gather()
            if self.agree_to_stop(batch is None):
                break
            window.wait_s += time.monotonic() - t0
            self.step(batch, window)
            now = time.monotonic()
            if self.rank == 0 and now >= next_ckpt:
                self.checkpoint()
                next_ckpt = now + self.job.logging.checkpoint_interval_s
            if self.control.due(now):
                self.report(window, now)
                window = ReportWindow(now, self.updates)
        if window.updates:  # the updates since the last heartbeat: a run that stopped within one reported no loss
            self.report(window, time.monotonic())
        self.finish()

    def step(self, batch: dict, window: "ReportWindow") -> None:
        """One update of the core on `batch`: feedback to the data path, counters, publication, digest chain."""
        result = self.core.update(batch)
        if self.updates == self.restored_updates:  # the first since start: bench/faults.py times restarts to here
            events.emit("first_update", process=self.rc.name, update=self.updates + 1)
        self.source.feedback(batch, result)
        self.updates += 1
        window.add(result)
        if self.updates % self.core.publish_interval == 0:
            self.version = self.updates
            self.publish()
        if self.world > 1:
            self.chain = hashlib.sha256((self.chain + parameter_digest(self.model)).encode()).hexdigest()

    def report(self, window: "ReportWindow", now: float) -> None:
        """The heartbeat of the updates since the last one: mean statistics, rates, the divergence guard's verdict."""
        dt = max(now - window.started, 1e-9)
        stats = {k: float(v) / window.updates for k, v in window.totals.items()}
        why = divergence(stats)
        if why and not self.diverging:
            self.rc.say(f"diverging after {self.updates} updates: {why}")
        self.diverging = why is not None
        self.control.heartbeat({
            "rank": self.rank, M.WORLD: self.world, **stats, M.DIVERGING: int(self.diverging), **self.source.metrics(),
            M.UPDATES: self.updates, M.VERSION: self.version, M.WAITING: 0, M.LEARNER_RESTARTS: self.restarts,
            M.NONFINITE_UPDATES: self.core.nonfinite_steps,
            M.UPDATES_PER_S: (self.updates - window.first_update) / dt,
            M.SAMPLES_PER_S: window.samples * self.world / dt, M.DATA_WAIT_FRAC: window.wait_s / dt,
            **({M.DIGEST_CHAIN: self.chain} if self.world > 1 else {}),
            **({M.WEIGHT_BOARD_SKIPS: self.pub.board_skips} if self.pub is not None and self.pub.board else {})})

    def finish(self) -> None:
        """After the stop: the last version published and checkpointed (rank 0), and the final heartbeat."""
        self.version = self.updates
        if self.rank == 0:
            self.checkpoint()
            self.publish()
        digest = parameter_digest(self.model)
        self.control.last_metrics_line()
        self.control.send("heartbeat", {"pid": os.getpid(), "rank": self.rank, "metrics": {
            "rank": self.rank, M.UPDATES: self.updates, M.VERSION: self.version, M.PARAM_DIGEST: digest,
            M.DIGEST_CHAIN: self.chain, M.FINAL: 1, **self.source.metrics()}})
        self.rc.say(f"stopped after {self.updates} updates (version {self.version}); parameter digest "
                    f"{digest[:16]}")

    def close(self) -> None:
        """Remove the weight board and close every socket."""
        if self.pub is not None:
            self.pub.close()
        self.net.close()


def init_process_group(backend: str, elastic: bool, heartbeat_timeout_s: float) -> None:
    """The process group, its keys in the rendezvous store under this restart's own prefix: after torchrun
    restarted the ranks, the store still held the dead ranks' addresses, and a new rank connected to those
    (gloo: "Connection refused") while its peer waited 30 s to be killed. An elastic world's ranks have a store of
    their own (rank 0's, new in each round: rlctl.launch.elastic) and no common restart count: a rejoining node's
    agent counts from 0 again, and with the count in the prefix its rank and rank 0 waited for each other's keys."""
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=rank == 0 and not agent_store,
                          wait_for_workers=False)
    prefix = "rlctl/round" if elastic else f"rlctl/restart-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    # An elastic world must notice a peer cut off by the network (no connection reset arrives): its collectives give
    # up after a third of the heartbeat timeout, not torch's 30 minutes, so that the group has re-formed without it
    # (about 8 s more) before the supervisor would take the silent head for hung. Ranks wait for each other only as
    # long as their data takes to come, and replay shards serve every rank at the same pace.
    seconds = max(heartbeat_timeout_s / 3, 10.0)
    timeout = {"timeout": datetime.timedelta(seconds=seconds)} if elastic else {}
    dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world, **timeout)


def headless(rc: RoleContext) -> bool:
    """Rank 0 of an elastic world without the head: the rendezvous ranks the head's node first whenever it takes
    part (rlctl.launch.elastic), so this round formed without it (its agent restarting its rank, or slow to renew
    its place)."""
    return rc.job.elastic_learners and rc.rank == 0 and rc.learner_node != 0


def run(rc: RoleContext, stop: StopFlag) -> None:
    """The learner process: process group, shell, clean up."""
    if headless(rc):
        # Learning would make a second run beside the head's: a second rank 0 publishing weights and writing
        # checkpoints (over the head's, on a shared filesystem). Its agent restarts it once the head waits to join.
        rc.say(f"rank 0 of a world of {rc.world_size} without the head's learner node: learning nothing until the "
               "head joins")
        while not stop:
            time.sleep(0.1)
        return
    device = learner_device(rc)
    pin_collective_interface()
    init_process_group("nccl" if device.type == "cuda" else "gloo", rc.job.elastic_learners,
                       rc.job.logging.heartbeat_timeout_s)
    try:
        shell = LearnerShell(rc, stop, device)
        try:
            shell.run()
        finally:
            shell.close()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    role_main(run)
