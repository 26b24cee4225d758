"""Job-file schema: the typed sections of a `JobSpec` and the checks across keys.

Every field has a docstring (shown by `rlctl validate --explain` and the README). Reading a file into a JobSpec, with
errors that name the file, key path and reason, is rlctl.job.load.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from rlctl.algos import ALGORITHMS, AlgorithmEntry
from rlctl.datapaths import DataPath
from rlctl.launch.ports import PortLayout
from rlctl.job.env_ids import env_id_problem
from rlctl.job.specbase import NonNegInt, PosFloat, PosInt, Section

LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_PORT = 65535
# With network.base_port = 0, rlctl.launch.plan.choose_base_port picks a range within these ports, in steps of 16. It ends
# where Linux's ephemeral ports begin (ip_local_port_range): any outgoing connection may hold one of those for a
# moment, and a Slurm test run failed its port check on one.
AUTO_PORTS = (20000, 32768)
ENTRY_POINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
ENV_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What an SSH destination or an address must not hold: ssh reads a leading `-` as an option, and these would mean
# something to the remote shell or split an argument (user@host, host names, IPv4 and IPv6 literals need none).
UNSAFE_ADDRESS_RE = re.compile(r"[\s\x00-\x1f\x7f-\x9f;&|$`'\"\\<>(){}]")


class StopSpec(Section):
    """When the run ends by itself (`finished`); the first criterion met wins."""

    env_steps: PosInt | None = None
    """Stop after this many environment steps over all collectors."""
    wall_s: PosFloat | None = None
    """Stop after this many seconds of wall time."""
    eval_return: float | None = None
    """Stop when the evaluator's mean greedy return reaches this (in `eval_rounds` rounds in a row)."""
    eval_rounds: Annotated[int, Field(ge=1, le=1000)] = 1
    """Consecutive evaluation rounds (each on fresh episodes) that must reach `eval_return`: one lucky
    round of a still-shaky policy does not end the run."""
    train_return: float | None = None
    """Stop when the mean return of the last `train_return_window` training episodes reaches this."""
    train_return_window: PosInt = 20
    """Number of recent training episodes averaged for `train_return`."""


class JobSection(Section):
    """What the run is called and how it is seeded and stopped."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    """Run-name prefix: letters, digits, `_`, `.`, `-` (run ids are `<name>-<timestamp>`)."""
    seed: NonNegInt = 0
    """Base random seed; every process derives its own from it."""
    stop: StopSpec = StopSpec()
    """Stop criteria."""


EntryPoint = Annotated[str, Field(pattern=ENTRY_POINT_PATTERN)]


class WrapperSpec(Section):
    """One gymnasium wrapper around every sub-env."""

    name: EntryPoint
    """The wrapper class, `module:Class`."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments after the env."""


class AtariPresetSpec(Section):
    """The `atari` preset's parameters: gymnasium's AtariPreprocessing, then FrameStackObservation."""

    noop_max: Annotated[int, Field(ge=0, le=1000)] = 30
    """Up to this many no-op actions after each reset (random starts)."""
    frame_skip: Annotated[int, Field(ge=1, le=32)] = 4
    """Emulator frames per env step (rewards summed, the last two frames max-pooled); the base env must skip none
    (`*NoFrameskip-v4` ids, or `ALE/*` ids, which the preset gives `frameskip = 1`)."""
    screen_size: Annotated[int, Field(ge=8, le=1024)] = 84
    """Frames are resized to screen_size x screen_size."""
    grayscale: bool = True
    """Grayscale frames (one channel), else RGB."""
    terminal_on_life_loss: bool = False
    """End an episode at each lost life (as the DQN paper trained), not only at game over."""
    frame_stack: Annotated[int, Field(ge=1, le=64)] = 4
    """Frames stacked into one observation, oldest first: (frame_stack, H, W) uint8."""


class EnvSpec(Section):
    """The environment every collector and the evaluator step."""

    id: Annotated[str, Field(min_length=1)]
    """A gymnasium id registered when gymnasium is imported (`CartPole-v1`; checked when the job is loaded) or an
    entry point `module:attr` (imported when the env is made), e.g. for an env of another package."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments passed to the environment constructor."""
    envs_per_collector: Annotated[int, Field(ge=1, le=65536)] = 8
    """Sub-environments in each collector's vector env."""
    vectorization: Literal["auto", "vector_entry_point", "sync", "async"] = "auto"
    """`auto`: the env's native vectorized implementation where it has one (gymnasium's CartPole; MinAtar's five
    games, stepped as arrays by rlctl.minatar_vec), else `sync`."""
    preset: Literal["none", "atari"] = "none"
    """`atari`: the standard Atari preprocessing around every sub-env (no-op starts, frame skip with max-pooling,
    84 x 84 grayscale, frame stacking; `[env.atari]` sets them), before `wrappers`. Needs `pip install -e
    '.[atari]'` (ale-py, whose wheel ships the ROMs). Frames stay uint8 up to the network, which scales them."""
    atari: AtariPresetSpec = AtariPresetSpec()
    """Parameters of the `atari` preset."""
    max_episode_steps: PosInt | None = None
    """Time limit override (episodes cut here count as truncated, not terminated)."""
    wrappers: Annotated[list[WrapperSpec], Field(max_length=32)] = []
    """gymnasium wrappers applied to every sub-env, in order, in collectors, evaluator and `rlctl eval` alike:
    `"module:Class"` or `{ name = "module:Class", kwargs = {...} }` (e.g. `"rlctl.envs:MaskVelocity"`)."""

    @field_validator("wrappers", mode="before")
    @classmethod
    def _wrapper_names(cls, value: Any) -> Any:
        # "module:Class" is short for { name = "module:Class" }.
        if isinstance(value, list):
            return [{"name": w} if isinstance(w, str) else w for w in value]
        return value

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if ":" in value:  # an entry point: imported where the env is made, so only its form is checked here
            if not re.fullmatch(ENTRY_POINT_PATTERN, value):
                raise ValueError("an entry point is `module:attr` (a dotted module path, a colon, a name)")
            return value
        problem = env_id_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check_wrappers(self) -> "EnvSpec":
        if self.preset != "none" and self.vectorization == "vector_entry_point":
            raise ValueError(f"preset: {self.preset!r} wraps every sub-env, which a native vectorized env cannot have; "
                             "use vectorization = \"auto\" (then \"sync\") or \"async\"")
        if self.wrappers and self.vectorization == "vector_entry_point":
            raise ValueError("wrappers: a native vectorized env cannot be wrapped per sub-env; use vectorization "
                             "= \"auto\" (then \"sync\") or \"async\"")
        return self


# Each algorithm's own section model, from the registry (rlctl.algos): the `[algorithm]` table is one of them,
# chosen by its `name`.
ALGORITHM_SPECS: dict[str, type[Section]] = {name: entry.load("spec") for name, entry in ALGORITHMS.items()}
for _name, _section in ALGORITHM_SPECS.items():  # each section has what its data path reads, or the registry is wrong
    ALGORITHMS[_name].data_path.check_section(ALGORITHMS[_name], _section)
ALGORITHM_NAMES = tuple(ALGORITHM_SPECS)
AlgorithmSpec = Annotated[Union[tuple(ALGORITHM_SPECS.values())], Field(discriminator="name")]


class ModelSpec(Section):
    """The network."""

    encoder: Literal["mlp", "conv"] = "mlp"
    """Observation encoder: `mlp` over flattened observations, or `conv` (Nature-DQN convolutions) for image
    observations shaped (H, W, C) or (C, H, W), uint8 pixels scaled to [0, 1]."""
    hidden: Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(min_length=1, max_length=16)] = [64, 64]
    """Hidden layer widths."""
    activation: Literal["relu", "tanh", "elu"] = "relu"
    """Hidden activation."""
    share_trunk: bool = False
    """PPO, APPO, IMPALA, A2C: actor and critic share the MLP trunk (RLlib's `vf_share_layers`, Sample Factory's
    `actor_critic_share_weights`): one trunk's work in each step instead of two, which may learn less per env
    step; separate trunks otherwise. Convolutions are always shared."""


class ReplaySpec(Section):
    """Prioritized replay shards (off-policy algorithms)."""

    capacity: Annotated[int, Field(ge=1, le=1 << 32)] = 100_000
    """Transitions per shard; the oldest are evicted first."""
    alpha: Annotated[float, Field(ge=0, le=1)] = 0.6
    """Priority exponent (0 = uniform)."""
    beta: Annotated[float, Field(ge=0, le=1)] = 0.4
    """Initial importance-sampling exponent, annealed to 1."""
    beta_steps: PosInt = 20_000
    """Sample calls over which beta reaches 1."""
    min_size: NonNegInt = 2000
    """Transitions a shard holds before it serves samples (DQN's learning_starts); at most `capacity`."""
    samples_per_insert: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    """Rate limit (Reverb's sample-to-insert ratio): a shard reads new experience only while
    inserted <= min_size + sampled / samples_per_insert, so collectors wait for the learner; 0 = off."""
    snapshot_interval_s: Annotated[float, Field(ge=0, le=1e7)] = 60.0
    """Seconds between snapshots of each shard's contents to its host's disk (also written at stop; 0: only at
    stop). A restarted or resumed shard loads the newest; a hard kill loses what arrived since."""

    @model_validator(mode="after")
    def _check_min_size(self) -> "ReplaySpec":
        if self.min_size > self.capacity:
            raise ValueError(f"min_size: {self.min_size} is more than replay.capacity {self.capacity}; a shard would "
                             "never serve samples")
        return self


class TopologySpec(Section):
    """How many of each process run (used when no `[[hosts]]` are listed)."""

    learner_procs: Annotated[int, Field(ge=1, le=1024)] = 1
    """Learner processes (torchrun `--nproc-per-node`) on each learner host (a host's own `learner_procs` wins)."""
    collectors: Annotated[int, Field(ge=0, le=100_000)] = 2
    """Collector processes. Keep them near the cores the machine has and scale `env.envs_per_collector` instead
    (one batched forward serves every env of a collector); `rlctl plan` warns when they would starve the learner."""
    replay_shards: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Replay shards; default one per learner rank."""
    evaluator: bool = True
    """Run an evaluator process."""
    inference: Literal["local", "central"] = "local"
    """`local`: collectors run the policy themselves. `central` (SEED RL style): collectors only step their envs and
    ask an inference server on a learner host for actions; the servers batch many collectors' requests into one
    forward, keep the experience and send it on ([inference] sets them up)."""
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    """Restarts allowed per collector, evaluator or replay shard within `restart_window_s` before the run fails;
    each waits twice as long as the one before (from `restart_backoff_s`)."""
    restart_window_s: Annotated[float, Field(gt=0, le=1e7)] = 600.0
    """The window `max_restarts` counts in: a process that ran this long since its last restart starts afresh."""
    restart_backoff_s: Annotated[float, Field(ge=0, le=3600)] = 0.5
    """Delay before a process's first restart in a window; doubled for each further one (at most 30 s)."""
    learner_max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    """torchrun's `--max-restarts`: after a learner rank dies every rank starts again from the newest checkpoint;
    past this many the run fails."""
    min_learner_nodes: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Elastic learners (torchrun's c10d rendezvous, `--nnodes MIN:MAX`): the learner goes on while this many of its
    nodes remain. A node whose rank dies, or whose host is lost, leaves the group; the others re-form it and go on
    from the last update (rank 0 saves it); the node rejoins when it (or its host) is back, or a spare host
    (`hosts[].spare`) takes its place. Every algorithm: a rollout algorithm's collectors then send to rank 0, which
    deals the rollouts to the ranks present. Default: every learner node (a fixed world: a lost node restarts them
    all)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Learner device: `auto` = cuda:LOCAL_RANK where a GPU is present, else CPU."""
    learner_threads: Annotated[int, Field(ge=0, le=1024)] = 0
    """torch threads of each learner rank. 0: the cores its host has left after every other rlctl process there
    that runs while it updates (one each: collectors, replay shards, evaluator and inference servers run one torch
    thread; a synchronous algorithm's collectors wait for the weights meanwhile and are not counted), shared by the
    host's learner ranks, at least 1. `rlctl plan` shows the choice."""
    learner_cores: Literal["shared", "dedicated"] = "shared"
    """`dedicated`: on each learner host, every learner rank pins itself to cores of its own (as many as its torch
    threads) and the host's other rlctl processes to the cores left, so collectors never take the learner's core
    when it is the bottleneck (image jobs on few cores, as Sample Factory pins its workers). Where that would leave
    no core for the others nothing is pinned. `shared`: the OS places every process. `rlctl plan` shows the cores."""


class InferenceSpec(Section):
    """Central inference servers (`topology.inference = "central"`)."""

    servers_per_host: Annotated[int, Field(ge=1, le=64)] = 1
    """Inference servers on each learner host; collector c asks server c mod (all servers). On a GPU host give one
    per GPU (server i runs on cuda:i mod the GPUs there)."""
    max_batch: Annotated[int, Field(ge=0, le=65536)] = 0
    """A batch closes once it holds this many requests (one per collector step, all of that collector's envs);
    0: no cap. It also closes as soon as every collector the server is serving has asked."""
    deadline_ms: Annotated[float, Field(gt=0, le=10_000)] = 2.0
    """A batch closes this long after its first request however few joined: the most a request waits for others."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the servers run the policy: `auto` = a GPU where present, else the CPU."""


class EvaluatorSpec(Section):
    """Greedy evaluation on the newest weights."""

    interval_s: Annotated[float, Field(ge=0, le=1e6)] = 2.0
    """Seconds between evaluation rounds (a round starts once new weights exist; at once while confirming the stop target)."""
    episodes: Annotated[int, Field(ge=1, le=100_000)] = 10
    """Episodes per round; their mean is `eval/return_mean`."""
    best_rounds: Annotated[int, Field(ge=1, le=1000)] = 10
    """Most rounds weights are scored on to become checkpoints/best.pt: new weights replace the best only if they
    match its score over one round more than it was scored on (at least two; 1: picked on a single round)."""


class WandbSpec(Section):
    """Weights & Biases: the run's scalars (and its job as the config) mirrored to a W&B run."""

    project: Annotated[str, Field(min_length=1, max_length=128)]
    """W&B project."""
    mode: Literal["offline", "online"] = "offline"
    """`offline`: written under the run directory (`wandb sync` uploads it later); `online`: streamed (W&B's own
    login or WANDB_API_KEY)."""
    entity: str | None = None
    """W&B entity (team or user); default W&B's."""

    @model_validator(mode="after")
    def _installed(self):
        if importlib.util.find_spec("wandb") is None:
            raise ValueError("needs the wandb package: pip install -e '.[wandb]'")
        return self


class LoggingSpec(Section):
    """Heartbeats, metrics and checkpoints."""

    metrics_interval_s: Annotated[float, Field(gt=0, le=3600)] = 1.0
    """Seconds between each process's heartbeat/metrics messages."""
    log_interval_s: Annotated[float, Field(gt=0, le=86400)] = 10.0
    """Seconds between the `metrics ...` lines each process writes to its log: its rates, returns and losses in one
    line (`rlctl logs`)."""
    checkpoint_interval_s: Annotated[float, Field(gt=0, le=1e7)] = 60.0
    """Seconds between learner checkpoints (one is always written at stop); those of SSH hosts come into the run
    directory as often (every 5 s at most)."""
    checkpoint_keep_every: NonNegInt = 10
    """Besides the newest, keep every Kth checkpoint (0 = newest only)."""
    heartbeat_timeout_s: Annotated[float, Field(gt=0, le=1e6)] = 60.0
    """A running process silent this long (frozen, deadlocked, stopped with SIGSTOP) is hung: it is killed and
    restarted like one that died (a learner rank through torchrun). An SSH host running only collectors, the
    evaluator and learner nodes of an elastic world (not the head), all silent this long, is lost: the collectors and
    evaluator start again on the other hosts, the learner node there again once the host answers."""
    wandb: WandbSpec | None = None
    """Mirror the run's scalars to Weights & Biases: `{ project = "...", mode = "offline" }` (needs the wandb
    extra); unset: TensorBoard only."""


class NetworkSpec(Section):
    """Ports of the data plane, and how long remote processes go on without word from the supervisor."""

    base_port: Annotated[int, Field(ge=0, le=65000)] = 0
    """First port of the job's contiguous range (which must end by 65535); 0 = the first free range from a per-job
    default, within ports 20000-32767 (below Linux's ephemeral ports)."""
    session_timeout_s: Annotated[float, Field(ge=1.0, le=86400.0)] = 30.0
    """A remote process whose SSH session brings nothing from the supervisor for this long (a network partition, a
    frozen supervisor) stops itself, rather than run on unsupervised; the supervisor pings every third of it."""
    relay_fanout: Annotated[int, Field(ge=1, le=4096)] = 16
    """Most hosts' weights relays that one sender hands each weights version to: learner rank 0 sends to the first
    this many, each of those to this many more, and so on (a tree, for runs of many hosts); no tree while every host
    is this machine."""


class ClusterNodeSpec(Section):
    """What runs on one node of a Slurm allocation, where it differs from the `[cluster]` rules."""

    learner: bool | None = None
    """Run a learner node here (in place of the first `cluster.learner_nodes` nodes)."""
    collectors: Annotated[int, Field(ge=0, le=100_000)] | None = None
    """Collector processes here."""
    replay_shards: Annotated[int, Field(ge=0, le=100_000)] | None = None
    """Replay shards here."""
    evaluator: bool | None = None
    """Run the evaluator here (and nowhere else)."""


class ClusterSpec(Section):
    """Where the hosts come from: `[[hosts]]` reached over SSH, or the nodes of a Slurm allocation."""

    scheduler: Literal["ssh", "slurm"] = "ssh"
    """`ssh`: the `[[hosts]]` listed (or this machine alone). `slurm`: run inside an allocation (`salloc`, or
    `rlctl run --sbatch`): the nodes of SLURM_JOB_NODELIST are the hosts, every process starts as a job step
    (`srun --overlap`), placed by the keys below."""
    learner_nodes: Annotated[int, Field(ge=1, le=4096)] = 1
    """Slurm: the first this many nodes of the allocation each run a torchrun learner node (the first is the head);
    `topology.learner_procs` processes on each."""
    collectors_per_node: Annotated[int, Field(ge=0, le=100_000)] = 2
    """Slurm: collector processes on every node that runs no learner."""
    learner_node_collectors: Annotated[int, Field(ge=0, le=100_000)] = 0
    """Slurm: collector processes on each learner node."""
    replay_shards_per_learner_node: Annotated[int, Field(ge=0, le=100_000)] | None = None
    """Slurm, replay algorithms: shards on each learner node, next to the ranks that sample them; default one per
    learner process there."""
    evaluator: Literal["head", "last", "none"] = "head"
    """Slurm: the evaluator runs on the head learner node, on the allocation's last node, or nowhere."""
    node_count: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Slurm: nodes the job uses, the allocation's first ones (default: all of them); what `--sbatch` asks for
    (default: the learner nodes and one more)."""
    nodes: dict[str, ClusterNodeSpec] = {}
    """Slurm: per-node overrides, by node name (`[cluster.nodes.gpu-017] collectors = 8`)."""
    python: str | None = None
    """Slurm: Python interpreter on the nodes; default the one running `rlctl` (a shared file system is assumed)."""
    workdir: str | None = None
    """Slurm: working directory on the nodes; default the directory `rlctl run` was started in."""
    sbatch_options: dict[str, str] = {}
    """Slurm: extra `#SBATCH --KEY=VALUE` lines for `rlctl run --sbatch` (e.g. `{ qos = "high" }`); `--partition`,
    `--time` and `--account` given on the command line win."""
    signal_grace_s: Annotated[int, Field(ge=0, le=65535)] = 120
    """Slurm: seconds before the allocation's time limit at which Slurm warns the supervisor (`--signal=B:USR1@N`;
    Slurm may send it up to 60 s earlier): the run then checkpoints everything and ends its segment as `preempted`.
    0: no warning."""
    requeue: bool = True
    """Slurm, `rlctl run --sbatch`: a preempted batch job (its time limit near, or Slurm preempting or requeueing it)
    is requeued and its next allocation resumes the same run directory, as `rlctl run --resume` does."""

    @field_validator("sbatch_options")
    @classmethod
    def _check_sbatch_options(cls, value: dict[str, str]) -> dict[str, str]:
        for key, option in value.items():
            if not re.fullmatch(r"[a-z][a-z0-9-]*", key) or UNSAFE_ADDRESS_RE.search(option):
                raise ValueError(f"{key} = {option!r}: an sbatch long option name and a value without whitespace "
                                 "or shell syntax")
        return value


class HostSpec(Section):
    """One machine of the job and what runs there."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    """Short name shown in status and logs."""
    address: str | None = None
    """SSH destination (anything `ssh` accepts, `~/.ssh/config` aliases too, but no leading `-`, whitespace or shell
    metacharacters); default `name`."""
    user: str | None = None
    """SSH user."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """SSH port."""
    identity_file: str | None = None
    """SSH identity file."""
    ssh_options: dict[str, str] = {}
    """Extra `ssh -o KEY=VALUE` options (e.g. `{ ProxyJump = "bastion" }`); `~/.ssh/config` applies as well."""
    python: str = "python3"
    """Python interpreter (or venv's) on that host."""
    workdir: str | None = None
    """Working directory there."""
    env: dict[str, str] = {}
    """Extra environment variables there (names of letters, digits and `_`, not starting with a digit)."""
    advertise_address: str | None = None
    """Address the other hosts reach this one at (and its servers bind); default: the host name its SSH destination
    resolves to (`ssh -G`: `~/.ssh/config` aliases applied), servers binding all interfaces."""
    learner: bool = False
    """Run a learner node here (a torchrun node); the first such host is the head (rank 0)."""
    learner_procs: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Learner processes on this node (torchrun `--nproc-per-node`); default `topology.learner_procs`."""
    spare: bool = False
    """A learner host held in reserve (elastic learners): its node starts once the learner group has formed and waits
    in the rendezvous; it takes the place of a node that leaves, and a node that comes back waits in its stead."""
    collectors: Annotated[int, Field(ge=0, le=100_000)] = 0
    """Collector processes here."""
    replay_shards: Annotated[int, Field(ge=0, le=100_000)] = 0
    """Replay shards here."""
    evaluator: bool = False
    """Run the evaluator here."""
    slurm_job: Annotated[int, Field(ge=1)] | None = None
    """Set by rlctl for the nodes of a Slurm allocation (`cluster.scheduler = "slurm"`): the job whose steps run here;
    not written by hand."""

    @field_validator("address", "user", "advertise_address")
    @classmethod
    def _check_address(cls, value: str | None) -> str | None:
        # These reach ssh's command line and the remote shell: nothing there may read as an option or as shell syntax.
        if value is None:
            return value
        if value.startswith("-"):
            raise ValueError("must not start with '-' (ssh would read it as an option)")
        bad = UNSAFE_ADDRESS_RE.search(value)
        if bad:
            raise ValueError(f"must not contain {bad.group()!r} (whitespace, control characters and shell "
                             "metacharacters are refused)")
        return value

    @field_validator("env")
    @classmethod
    def _check_env_names(cls, value: dict[str, str]) -> dict[str, str]:
        # Names are written unquoted into the remote shell's command line (`env NAME=value ...`).
        for name in value:
            if not ENV_VAR_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits and _, not "
                                 "starting with a digit)")
        return value

    @property
    def destination(self) -> str:
        """The SSH destination."""
        return self.address or self.name

    @property
    def is_local(self) -> bool:
        """True when this host is the launching machine (a Slurm node never is: its processes are job steps)."""
        return self.slurm_job is None and self.destination in LOCAL_ADDRESSES


# topology.* counts that [[hosts]] replace (each host gives its own).
HOST_COUNT_KEYS = frozenset({"collectors", "replay_shards", "evaluator"})


class JobSpec(Section):
    """A whole job file."""

    job: JobSection
    env: EnvSpec
    algorithm: AlgorithmSpec
    model: ModelSpec = ModelSpec()
    replay: ReplaySpec = ReplaySpec()
    topology: TopologySpec = TopologySpec()
    inference: InferenceSpec = InferenceSpec()
    evaluator: EvaluatorSpec = EvaluatorSpec()
    logging: LoggingSpec = LoggingSpec()
    network: NetworkSpec = NetworkSpec()
    cluster: ClusterSpec = ClusterSpec()
    hosts: list[HostSpec] = []

    @model_validator(mode="after")
    def _check_collectors(self) -> "JobSpec":
        self.data_path.check_collectors(self)
        return self

    def _explicit_host_counts(self) -> str:
        """The topology counts the job file sets that hosts (or [cluster]) set instead, as key paths ("" if none)."""
        return ", ".join(f"topology.{k}" for k in sorted(self.topology.model_fields_set & HOST_COUNT_KEYS))

    @model_validator(mode="after")
    def _check_cluster(self) -> "JobSpec":
        slurm = self.cluster.scheduler == "slurm"
        if slurm and any(h.slurm_job is None for h in self.hosts):
            raise ValueError('hosts: with cluster.scheduler = "slurm" the hosts are the allocation\'s nodes; place '
                             "roles with [cluster] and [cluster.nodes.NAME] instead of [[hosts]]")
        if not slurm and any(h.slurm_job is not None for h in self.hosts):
            raise ValueError('hosts: slurm_job is set by rlctl for cluster.scheduler = "slurm" only')
        if slurm and not self.hosts:
            keys = self._explicit_host_counts()
            if keys:
                raise ValueError(f"{keys}: with cluster.scheduler = \"slurm\", [cluster] places processes "
                                 "(collectors_per_node, replay_shards_per_learner_node, evaluator)")
        return self

    @model_validator(mode="after")
    def _check_hosts(self) -> "JobSpec":
        if not self.hosts:
            return self
        # Messages start with the key path they concern ("key: reason"); validate_job splits them.
        names = [h.name for h in self.hosts]
        for i, n in enumerate(names):
            if names.index(n) != i:
                raise ValueError(f"hosts[{i}].name: host names must be unique; {n!r} is also hosts[{names.index(n)}]")
        keys = self._explicit_host_counts()
        if keys:
            raise ValueError(f"{keys}: with [[hosts]] listed, set these counts per host instead")
        if not any(h.learner for h in self.hosts):
            raise ValueError("hosts: at least one host must have learner = true (the first one is the head, rank 0)")
        if sum(h.evaluator for h in self.hosts) > 1:
            raise ValueError("hosts: at most one host may have evaluator = true")
        self.data_path.check_hosts(self)
        for i, h in enumerate(self.hosts):
            if h.learner_procs is not None and not h.learner:
                raise ValueError(f"hosts[{i}].learner_procs: {h.name!r} runs no learner (set learner = true)")
        if not all(h.is_local for h in self.hosts):
            # Remote hosts connect to this machine's servers, so "localhost" is not an address they can use.
            for i, h in enumerate(self.hosts):
                if h.is_local and (h.learner or h.replay_shards) and not h.advertise_address:
                    raise ValueError(f"hosts[{i}].advertise_address: {h.name!r} runs servers that remote hosts connect "
                                     "to; give the address they reach this machine at")
        return self

    @model_validator(mode="after")
    def _check_elastic(self) -> "JobSpec":
        least, nodes = self.topology.min_learner_nodes, self.max_learner_nodes
        if not self.hosts and self.cluster.scheduler == "slurm":
            nodes = self.cluster.learner_nodes  # the allocation's hosts are placed at run time
        head = next((i for i, h in enumerate(self.hosts) if h.learner), None)
        for i, h in enumerate(self.hosts):
            if h.spare and not h.learner:
                raise ValueError(f"hosts[{i}].spare: only a learner host can be a spare (set learner = true)")
            if h.spare and i == head:
                raise ValueError(f"hosts[{i}].spare: the first learner host is the head (rank 0, the weights and "
                                 "checkpoints): it cannot be a spare")
            if h.spare and least is None:
                raise ValueError(f"hosts[{i}].spare: a spare learner host needs elastic learners (set "
                                 "topology.min_learner_nodes)")
        if least is None:
            return self
        if least > nodes:
            spares = " (spares aside)" if nodes < len(self.learner_node_procs) else ""
            raise ValueError(f"topology.min_learner_nodes: {least} is more than the job's {nodes} learner node"
                             f"{'s' if nodes > 1 else ''}{spares}")
        return self

    @property
    def elastic_learners(self) -> bool:
        """Whether the learner nodes form an elastic world (topology.min_learner_nodes below their number, or spare
        learner hosts to take a lost node's place)."""
        least = self.topology.min_learner_nodes
        most = self.max_learner_nodes
        return least is not None and (least < most or most < len(self.learner_node_procs))

    @property
    def max_learner_nodes(self) -> int:
        """Learner nodes the group holds at most (torchrun's `--nnodes MIN:MAX`): every learner host but the spares."""
        return sum(1 for h in self.hosts if h.learner and not h.spare) if self.hosts else len(self.learner_node_procs)

    @model_validator(mode="after")
    def _check_runnable(self) -> "JobSpec":
        # After the checks above, so that their (more basic) complaints come first.
        if self.model.share_trunk and not self.algorithm_entry.actor_critic:
            raise ValueError(f"model.share_trunk: {self.algorithm.name} learns one Q-network, which has no separate "
                             "critic; share_trunk is for PPO, APPO, IMPALA and A2C")
        self.data_path.check_algorithm(self)
        need, base = self.port_count, self.network.base_port
        top = MAX_PORT + 1 - need  # the highest base that fits the job's range
        fix = f"set network.base_port to at most {top}" if top >= 1024 else "run fewer replay shards or learner ranks"
        if base and base > top:
            raise ValueError(f"network.base_port: the job's {need} ports from {base} run past {MAX_PORT} (to "
                             f"{base + need - 1}); {fix}")
        if not base and need > AUTO_PORTS[1] - AUTO_PORTS[0]:
            raise ValueError(f"network.base_port: 0 picks a range within ports {AUTO_PORTS[0]}-{AUTO_PORTS[1] - 1}, "
                             f"too few for the job's {need} ports; set network.base_port")
        return self

    @property
    def algorithm_entry(self) -> AlgorithmEntry:
        """The algorithm's registry entry (its traits and parts); `algorithm` is the job's `[algorithm]` section."""
        return ALGORITHMS[self.algorithm.name]

    @property
    def data_path(self) -> DataPath:
        """The data path of the job's algorithm (rlctl.datapaths)."""
        return self.algorithm_entry.data_path

    @property
    def learner_node_procs(self) -> list[int]:
        """Learner processes of each learner node, head first (ranks are numbered node after node)."""
        if not self.hosts:
            return [self.topology.learner_procs]
        return [h.learner_procs or self.topology.learner_procs for h in self.hosts if h.learner]

    @property
    def learner_ranks(self) -> int:
        """Total learner processes (DDP world size)."""
        return sum(self.learner_node_procs)

    @property
    def max_world_ranks(self) -> int:
        """The most learner ranks a group can hold at once: all of them, but with spare hosts the head's and those of
        the largest other nodes that fit in `max_learner_nodes`."""
        head, *others = self.learner_node_procs
        return head + sum(sorted(others, reverse=True)[:self.max_learner_nodes - 1])

    def first_rank_of(self, node: int) -> int:
        """The plan's global rank of learner node `node`'s local rank 0 (ranks are numbered node after node)."""
        return sum(self.learner_node_procs[:node])

    def learner_node_of(self, rank: int) -> int:
        """The learner node that runs global rank `rank` (torchrun numbers ranks node after node)."""
        first = 0
        for node, procs in enumerate(self.learner_node_procs):
            if rank < first + procs:
                return node
            first += procs
        raise ValueError(f"rank {rank} is outside the job's {self.learner_ranks} learner ranks")

    @property
    def replay_shard_count(self) -> int:
        """Total replay shards (0 when the data path has none)."""
        return self.data_path.shard_count(self)

    @property
    def collector_count(self) -> int:
        """Total collector processes."""
        return sum(h.collectors for h in self.hosts) if self.hosts else self.topology.collectors

    @property
    def central_inference(self) -> bool:
        """Collectors ask inference servers for actions (SEED RL style) instead of running the policy."""
        return self.topology.inference == "central"

    @property
    def inference_server_count(self) -> int:
        """Inference servers in all: `inference.servers_per_host` on each learner host (0 with local inference)."""
        return len(self.learner_node_procs) * self.inference.servers_per_host if self.central_inference else 0

    @property
    def port_count(self) -> int:
        """Size of the job's contiguous port range (laid out by rlctl.launch.ports.PortLayout)."""
        return PortLayout(self, 0).size
