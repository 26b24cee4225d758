"""Every metric name, in one place: roles send them in heartbeats, the supervisor aggregates them, TensorBoard,
state.json and the live table show them. Fixed namespaces (as CleanRL): `charts/` (env steps, episodes),
`losses/`, `learner/`, `replay/`, `collector/`, `eval/`, `net/`. Standard library only (the CLI path reads it).
"""

# Run-level figures (the supervisor's MetricsHub).
ENV_STEPS = "charts/env_steps"
ENV_STEPS_PER_S = "charts/env_steps_per_s"
EPISODES = "charts/episodes"
EPISODE_RETURN = "charts/episode_return"
EPISODE_RETURN_MEAN = "charts/episode_return_mean"
EPISODE_RETURN_BEST = "charts/episode_return_best"  # the best EPISODE_RETURN_MEAN so far (over every segment)
EPISODE_LENGTH_MEAN = "charts/episode_length_mean"

# Losses (learner cores).
TD_LOSS = "losses/td_loss"
POLICY_LOSS = "losses/policy_loss"
VALUE_LOSS = "losses/value_loss"
ENTROPY = "losses/entropy"
APPROX_KL = "losses/approx_kl"
CLIPFRAC = "losses/clipfrac"

# Learner shell.
UPDATES = "learner/updates"
UPDATES_PER_S = "learner/updates_per_s"
SAMPLES_PER_S = "learner/samples_per_s"
VERSION = "learner/version"
WORLD = "learner/world"  # learner ranks in the group now (an elastic world shrinks and grows with its nodes)
LEARNER_RESTARTS = "learner/restarts"  # torchrun's restarts of the learner ranks (each from the newest checkpoint)
WAITING = "learner/waiting"
DATA_WAIT_FRAC = "learner/data_wait_frac"  # share of the time the learner waited for samples or rollouts
Q_MEAN = "learner/q_mean"
Q_ABS_MAX = "learner/q_abs_max"  # largest |Q| of a batch, in return units (averaged between heartbeats)
Q_BOUND = "learner/q_bound"  # the largest |Q| the rewards seen and gamma allow: max|r| / (1 - gamma)
DIVERGING = "learner/diverging"  # 1 while the learner's values are non-finite or run far past Q_BOUND
GRAD_NORM = "learner/grad_norm"  # global gradient norm before clipping, mean over an update's steps
NONFINITE_UPDATES = "learner/nonfinite_updates"  # gradient steps skipped for a non-finite gradient (never applied)
LR = "learner/lr"
POLICY_LAG_MEAN = "learner/policy_lag_mean"
ROLLOUTS_DROPPED = "learner/rollouts_dropped"
PARAM_DIGEST = "learner/param_digest"
DIGEST_CHAIN = "learner/digest_chain"
FINAL = "learner/final"

# Replay shards.
REPLAY_SIZE = "replay/size"
REPLAY_INSERTED = "replay/inserted"
REPLAY_INSERT_PER_S = "replay/insert_per_s"
REPLAY_SAMPLED_PER_S = "replay/sampled_per_s"
REPLAY_PENDING = "replay/pending_requests"
REPLAY_FRAMES_PER_ITEM = "replay/frames_per_item"  # frame-stack jobs: frames stored per transition (rlctl.data.frames)

# Collectors (per process; the hub sums them into ENV_STEPS and ENV_STEPS_PER_S).
COLLECTOR_ENV_STEPS = "env_steps"
COLLECTOR_WEIGHT_VERSION = "collector/weight_version"
COLLECTOR_WEIGHT_VERSION_LAG = "collector/weight_version_lag"
COLLECTOR_SENT = "collector/sent"
# Share of the time a collector waited instead of stepping: for room to send (a rate-limited replay shard, a busy
# learner), for the next weights (PPO), or in central inference for its actions. The hub averages collectors.
COLLECTOR_WAIT_FRAC = "collector/wait_frac"
EPISODE_RETURNS = "episode_returns"  # lists of the episodes that ended since the last heartbeat
EPISODE_LENGTHS = "episode_lengths"

# Central inference: collectors of central jobs, and the inference servers (the hub: sums of rates, the largest
# latencies, the mean batch).
COLLECTOR_TORCH_LOADED = "collector/torch_loaded"  # 1 if torch is imported in the collector (never, in central mode)
COLLECTOR_INFERENCE_MS = "collector/inference_ms"  # mean round trip of a request for actions, as the collector sees it
COLLECTOR_STALE_ANSWERS = "collector/stale_answers"  # second answers to a request sent again, dropped unread
INFERENCE_BATCH_SIZE_MEAN = "inference/batch_size_mean"  # requests (collector steps) per forward
INFERENCE_LATENCY_P50 = "inference/latency_ms_p50"  # from a request's arrival to its answer
INFERENCE_LATENCY_P99 = "inference/latency_ms_p99"
INFERENCE_REQUESTS_PER_S = "inference/requests_per_s"
INFERENCE_UNDELIVERABLE = "inference/undeliverable"  # answers to collectors that were gone (killed mid-request)
INFERENCE_RESENT = "inference/resent"  # answers sent again to a collector that asked again
INFERENCE_SESSIONS = "inference/sessions"  # collector sessions held (one per collector process seen)
# Sessions begun since the server started: one per collector process (a restarted collector begins another).
INFERENCE_SESSIONS_BEGUN = "inference/sessions_begun"
INFERENCE_WEIGHT_VERSION = "inference/weight_version"

# A host's weights relay (rlctl.roles.relay).
RELAY_VERSIONS_PER_S = "relay/versions_per_s"  # new versions taken from learner rank 0 and handed on
RELAY_WEIGHT_VERSION = "relay/weight_version"
RELAY_REPORTS = "relay/reports"  # hellos and heartbeats of its host's processes taken and bundled, since its start
# Learner rank 0 and relays: versions not written to their board because every slot but the newest was held by a
# collector (rlctl.net.weights), since the process started; the collectors there then hold an older version.
WEIGHT_BOARD_SKIPS = "weights/board_skips"

# Evaluator.
EVAL_RETURN_MEAN = "eval/return_mean"
EVAL_RETURN_MIN = "eval/return_min"
EVAL_LENGTH_MEAN = "eval/length_mean"
EVAL_VERSION = "eval/version"
EVAL_ROUNDS = "eval/rounds"
EVAL_STREAK = "eval/streak"

# Every process.
NET_DROPPED = "net/dropped"
NET_REFUSED = "net/refused"
