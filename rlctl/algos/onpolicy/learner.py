"""The rollout algorithms' learner cores: PPO/APPO (clipped surrogate, GAE or V-trace) and IMPALA (V-trace)."""

from __future__ import annotations

import torch

from rlctl import metric_names as M
from rlctl.algos.base import LearnerCore, LearnerSetup, Loss, minibatch_epochs
from rlctl.algos.onpolicy.actor import build_model
from rlctl.algos.onpolicy.returns import gae, impala_loss, ppo_loss, vtrace
from rlctl.models import ActorCritic, as_float, take_columns
from rlctl.optim import build_optimizer


class RolloutCore(LearnerCore):
    """Actor-critic, optimizer and learning-rate schedule of one rank; a batch is [T(+1), B, ...] rollouts."""

    def __init__(self, setup: LearnerSetup):
        super().__init__(setup)
        job, algo = setup.job, setup.algo
        self.algo, self.device = algo, setup.device
        self.model: ActorCritic = build_model(job, setup.info).to(setup.device)
        self.train_model = setup.distribute(self.model)
        self.opt = self._optimizer()
        # Env steps that one version consumes over all ranks (for learning-rate annealing, identical on every rank):
        # APPO's and IMPALA's follow the world, which changes in an elastic one, so the steps are summed as they go.
        per_rollout = algo.rollout_len * job.env.envs_per_collector
        rollouts = (job.collector_count if job.algorithm_entry.synchronous
                    else algo.rollouts_per_update(job.env.envs_per_collector) * setup.world)
        self.steps_per_version = per_rollout * rollouts
        self.generator = torch.Generator().manual_seed(job.job.seed * 1000 + setup.rank)
        self.version = 0
        self.env_steps = 0  # env steps of the versions so far, over all ranks
        self.max_grad_norm = algo.max_grad_norm
        self.cols: torch.Tensor | None = None  # PPO: the live observation columns of the update (steps)

    def _optimizer(self) -> torch.optim.Optimizer:
        # Fused: one kernel for every parameter (as the Ape-X learner; ~15% of a small network's round on CPU).
        return build_optimizer("adam", self.model.parameters(), lr=self.algo.lr, eps=self.algo.adam_eps)

    def set_lr(self) -> float:
        """Linear annealing to 0 over `lr_anneal_steps` env steps (constant when unset)."""
        lr = self.algo.lr
        if self.algo.lr_anneal_steps:
            lr *= max(1.0 - self.env_steps / self.algo.lr_anneal_steps, 0.0)
        for group in self.opt.param_groups:
            group["lr"] = lr
        return lr

    def _forward_all(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Heads [T, B, A] of the first T rows of [T+1, B, ...] observations and values [T+1, B]: the T rows through
        DDP, the bootstrap row's values without grad (no loss reads its head or a gradient of its value, so its
        backward would be a 1/T share of the update's work for nothing)."""
        rows, b = obs.shape[:2]
        head, value = self.train_model(obs[:-1].reshape((rows - 1) * b, *obs.shape[2:]))
        with torch.no_grad():
            bootstrap = self.model.value(obs[-1])
        return head.reshape(rows - 1, b, -1), torch.cat([value.reshape(rows - 1, b), bootstrap[None]])

    def begin_update(self, batch: dict) -> dict:
        """The learning rate of this version."""
        return {M.LR: self.set_lr()}

    def end_update(self, batch: dict) -> None:
        """One new version."""
        self.version += 1
        self.env_steps += self.steps_per_version

    def samples(self, batch: dict) -> int:
        """Valid env steps of the rollouts."""
        return int(batch["valid"].sum())

    def state_dict(self) -> dict:
        """Optimizer, version, env steps and the minibatch generator."""
        return {"optimizer": self.opt.state_dict(), "version": self.version, "env_steps": self.env_steps,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""
        self.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        # A checkpoint from before the steps were kept: its versions were all of this world's size.
        self.env_steps = int(state.get("env_steps", self.version * self.steps_per_version))
        self.generator.set_state(state["generator"])


class PPOLearner(RolloutCore):
    """PPO and APPO: `epochs` x `minibatches` clipped-surrogate steps on GAE (or, APPO with vtrace, V-trace)
    advantages; every rank takes the same number of DDP steps."""

    def _advantages(self, r: dict[str, torch.Tensor], rewards: torch.Tensor):
        """(advantages, returns, behaviour values) [T, B]: GAE on the values the actors recorded."""
        adv, returns = gae(rewards, r["value"], r["terminated"], r["done"], r["valid"], self.algo.gamma,
                           self.algo.gae_lambda)
        return adv, returns, r["value"][:-1]

    def steps(self, r: dict[str, torch.Tensor]):
        """`epochs` x `minibatches` steps over the valid rows, advantages computed once before them."""
        algo = self.algo
        rewards = r["reward"] * algo.reward_scale
        T, B = rewards.shape
        actions = r["action"]
        with torch.no_grad():
            adv, returns, old_values = self._advantages(r, rewards)
        keep = r["valid"].reshape(-1).nonzero().squeeze(1)
        # Observations stay as sent (bool grids for MinAtar) until a minibatch's forward: index_select of bool rows
        # is 15x faster than of float ones.
        obs = r["obs"][:T].reshape(T * B, *r["obs"].shape[2:]).index_select(0, keep)
        # Boolean grids train on the columns some row sets (exact: models.live_columns), cut once per update.
        self.cols = self.model.live_columns(obs)
        if self.cols is not None:
            obs = take_columns(obs.flatten(1), self.cols)
        rows = {"obs": obs,
                "action": actions.reshape(T * B, *actions.shape[2:])[keep], "logp": r["logp"].reshape(-1)[keep],
                "adv": adv.reshape(-1)[keep], "ret": returns.reshape(-1)[keep], "v": old_values.reshape(-1)[keep]}
        yield from minibatch_epochs(rows, algo.epochs, algo.minibatches, self.generator, self.device)

    def loss(self, mb: dict[str, torch.Tensor], report: bool) -> Loss:
        """The clipped surrogate, value and entropy loss of one minibatch (diagnostics on the last epoch)."""
        algo = self.algo
        if len(mb["adv"]) == 0:
            return self.zero_loss()
        # Boolean grids (MinAtar) become floats once per minibatch, not in each of the two trunks.
        obs = as_float(mb["obs"]) if mb["obs"].dtype == torch.bool else mb["obs"]
        head, value = self.train_model(obs, self.cols)
        logp, entropy = self.model.log_prob_entropy(head, mb["action"])
        adv = mb["adv"]
        if algo.norm_adv and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss, stats = ppo_loss(logp, mb["logp"], adv, value, mb["v"], mb["ret"], entropy, algo.clip, algo.value_clip,
                               algo.vf_coef, algo.ent_coef, diagnostics=report)
        return Loss(loss, stats)


class APPOLearner(PPOLearner):
    """APPO: PPO's loss on asynchronous rollouts; with `vtrace`, V-trace targets on the current values (as Sample
    Factory's APPO) correct for the policy lag, else GAE as PPO."""

    def __init__(self, setup: LearnerSetup):
        super().__init__(setup)
        algo = self.algo
        # One step per batch: the V-trace targets come from the training forward's own detached values and
        # log-probs (the weights a separate no-grad pass would see), which saves that pass, a third of the update.
        self.one_pass = algo.vtrace and algo.epochs == 1 and algo.minibatches == 1

    def steps(self, r: dict[str, torch.Tensor]):
        """The whole batch once (one pass), else PPO's epochs x minibatches."""
        if self.one_pass:
            yield r, True
        else:
            yield from super().steps(r)

    def loss(self, part: dict[str, torch.Tensor], report: bool) -> Loss:
        """One pass: PPO's loss on V-trace targets from the training forward itself; else PPO's minibatch loss."""
        if not self.one_pass:
            return super().loss(part, report)
        algo, r = self.algo, part
        rewards = r["reward"] * algo.reward_scale
        T, B = rewards.shape
        head, values = self._forward_all(r["obs"])
        logp, entropy = self.model.log_prob_entropy(head.reshape(T * B, -1), r["action"].reshape(T * B, -1))
        keep = r["valid"].reshape(-1).nonzero().squeeze(1)
        if len(keep) == 0:  # nothing to learn here, but peers wait for this step's all-reduce: a zero loss
            return Loss((head.sum() + values.sum()) * 0.0)
        with torch.no_grad():
            returns, adv = vtrace(r["logp"], logp.detach().reshape(T, B), rewards, values.detach(), r["terminated"],
                                  r["done"], r["valid"], algo.gamma, algo.rho_bar, algo.c_bar)
        adv = adv.reshape(-1)[keep]
        if algo.norm_adv and len(keep) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        new_values = values[:T].reshape(-1)[keep]
        loss, stats = ppo_loss(logp[keep], r["logp"].reshape(-1)[keep], adv, new_values, new_values.detach(),
                               returns.reshape(-1)[keep], entropy[keep], algo.clip, algo.value_clip, algo.vf_coef,
                               algo.ent_coef)
        return Loss(loss, stats)

    def _advantages(self, r, rewards):
        algo = self.algo
        if not algo.vtrace:
            return super()._advantages(r, rewards)
        T, B = rewards.shape
        head, values = self._forward_all(r["obs"])
        logp_now, _ = self.model.log_prob_entropy(head.reshape(T * B, -1), r["action"].reshape(T * B, -1))
        returns, adv = vtrace(r["logp"], logp_now.reshape(T, B), rewards, values, r["terminated"], r["done"],
                              r["valid"], algo.gamma, algo.rho_bar, algo.c_bar)
        return adv, returns, values[:T]


class ActorCriticCore(RolloutCore):
    """One actor-critic step per batch (IMPALA, A2C): RMSProp (as their papers) or Adam, per `algo.optimizer`."""

    def _optimizer(self) -> torch.optim.Optimizer:
        algo = self.algo
        if algo.optimizer == "rmsprop":
            return build_optimizer("rmsprop", self.model.parameters(), lr=algo.lr, alpha=algo.rmsprop_alpha,
                                   eps=algo.adam_eps)
        return super()._optimizer()

    def _evaluate(self, r: dict[str, torch.Tensor]):
        """(scaled rewards, log-probs and entropies of the taken actions [T, B], values [T+1, B]) through the
        training forward (the bootstrap row's value without grad)."""
        rewards = r["reward"] * self.algo.reward_scale
        T, B = rewards.shape
        head, values = self._forward_all(r["obs"])
        logp, entropy = self.model.log_prob_entropy(head.reshape(T * B, -1), r["action"].reshape(T * B, -1))
        return rewards, logp.reshape(T, B), entropy.reshape(T, B), values


class IMPALALearner(ActorCriticCore):
    """IMPALA: one actor-critic step on V-trace targets from the behaviour log-probs."""

    def loss(self, r: dict[str, torch.Tensor], report: bool) -> Loss:
        """The actor-critic loss on V-trace targets, over the whole batch."""
        algo = self.algo
        rewards, logp, entropy, values = self._evaluate(r)
        T = rewards.shape[0]
        with torch.no_grad():
            vs, pg_adv = vtrace(r["logp"], logp.detach(), rewards, values.detach(), r["terminated"], r["done"],
                                r["valid"], algo.gamma, algo.rho_bar, algo.c_bar)
        loss, stats = impala_loss(logp, entropy, values[:T], vs, pg_adv, r["valid"].float(), algo.vf_coef,
                                  algo.ent_coef)
        return Loss(loss, stats)
