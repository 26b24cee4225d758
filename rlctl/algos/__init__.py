"""Algorithms as plug-ins: one registry entry per algorithm, the only place that knows them by name.

An entry holds lazy `"module:attr"` references (nothing heavy is imported until a role needs it; the CLI path
imports none of them) and the traits the rest of rlctl plans and runs by:

* `spec`: its `[algorithm]` section model (pydantic only, no torch), assembled into the job schema by rlctl.job.spec;
* `learner`: its `LearnerCore` (rlctl.algos.base): the update math the learner shell (roles/learner.py) feeds;
* `actor`: its `ActorCore`: acting and cutting experience inside the collector shell (roles/collector.py);
* `model`: `build(job, info) -> nn.Module`, the network the learner trains and actors and evaluators run;
* `data`: the name of its data path (rlctl.datapaths: `replay` or `rollouts`), which owns how experience travels;
* `synchronous`: collectors wait for each new version (every round on-policy), else they never wait;
* `recurrent`: policies carry a state across steps (`greedy(obs, state) -> (actions, state)`);
* `actor_critic`: its model is rlctl.models.ActorCritic (a policy and a critic), not a Q-network.

Adding an algorithm = its own package under rlctl/algos, one entry below, a job file and tests.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from rlctl.datapaths import DATA_PATHS, REPLAY, ROLLOUTS, DataPath



@dataclass(frozen=True)
class AlgorithmEntry:
    """What rlctl knows of one algorithm: lazy references to its parts, and its traits."""

    name: str
    spec: str
    learner: str
    actor: str
    model: str
    data: str
    synchronous: bool = False
    recurrent: bool = False
    actor_critic: bool = False

    @property
    def data_path(self) -> DataPath:
        """The data path its experience travels by."""
        return DATA_PATHS[self.data]

    def load(self, part: str):
        """The object one of `spec`, `learner`, `actor`, `model` refers to, imported now."""
        return load_ref(getattr(self, part))


def load_ref(ref: str):
    """Import `module:attr` and return the attribute."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _onpolicy(name: str, spec: str, learner: str, synchronous: bool = False) -> AlgorithmEntry:
    return AlgorithmEntry(name, f"rlctl.algos.onpolicy.spec:{spec}", f"rlctl.algos.onpolicy.learner:{learner}",
                          "rlctl.algos.onpolicy.actor:RolloutActor", "rlctl.algos.onpolicy.actor:build_model",
                          ROLLOUTS, synchronous=synchronous, actor_critic=True)


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "apex": AlgorithmEntry("apex", "rlctl.algos.apex.spec:ApexSpec", "rlctl.algos.apex.learner:ApexLearner",
                           "rlctl.algos.apex.actor:ApexActor", "rlctl.algos.apex.actor:build_model", REPLAY),
    "ppo": _onpolicy("ppo", "PPOSpec", "PPOLearner", synchronous=True),
    "appo": _onpolicy("appo", "APPOSpec", "APPOLearner"),
    "impala": _onpolicy("impala", "IMPALASpec", "IMPALALearner"),
    "r2d2": AlgorithmEntry("r2d2", "rlctl.algos.r2d2.spec:R2D2Spec", "rlctl.algos.r2d2.learner:R2D2Learner",
                           "rlctl.algos.r2d2.actor:R2D2Actor", "rlctl.algos.r2d2.actor:build_model", REPLAY,
                           recurrent=True),
    "a2c": AlgorithmEntry("a2c", "rlctl.algos.a2c.spec:A2CSpec", "rlctl.algos.a2c.learner:A2CLearner",
                          "rlctl.algos.onpolicy.actor:RolloutActor", "rlctl.algos.onpolicy.actor:build_model",
                          ROLLOUTS, synchronous=True, actor_critic=True),
}


def build_model(job, info):
    """The network of the job's algorithm for its env's spaces (`job` a JobSpec, `info` an envs.SpaceInfo)."""
    return job.algorithm_entry.load("model")(job, info)

