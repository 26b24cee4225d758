"""Single-process JAX + gymnax PPO on MinAtar: the baseline rlctl is compared against.

Written here after PureJaxRL's published PPO algorithm and MinAtar settings (no code copied): 64 vectorised gymnax
envs x 128 steps per update, GAE (gamma 0.99, lambda 0.95), 4 epochs x 8 minibatches, clipped surrogate (0.2),
clipped value loss (value coef 0.5), entropy coef 0.01, advantages normalised per minibatch, global grad-norm clip 0.5,
Adam (eps 1e-5) with lr 5e-3 annealed linearly to 0 over 10M env steps. Separate actor and critic MLPs (64-64, ReLU,
orthogonal init: sqrt(2) hidden, 0.01 actor head, 1.0 critic head) on the flattened 10x10xC float32 observation,
categorical policy. Envs auto-reset inside gymnax's step; each env uses its default params.

Time to reward is measured from process start as a user sees it: imports and compilation count. One update (rollout
via lax.scan + GAE + minibatch epochs) is jitted and called from a Python loop, so the host sees every update.

    python bench/minatar_jax.py --game breakout --seed 1 [--target 10.0] [--max-env-steps 2000000] [--json]

Stdout: one JSON object per line (always; --json is accepted for callers that pass it): `progress` after each update,
`target` the first time the mean return of the last 100 completed episodes reaches --target (then exit 0), `end`
when --max-env-steps is reached without the target.
"""
import time

T_START = time.time()

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import flax.linen as nn  # noqa: E402
import gymnax  # noqa: E402
import optax  # noqa: E402

GAMES = {"breakout": "Breakout-MinAtar", "asterix": "Asterix-MinAtar", "freeway": "Freeway-MinAtar",
         "space_invaders": "SpaceInvaders-MinAtar", "seaquest": "Seaquest-MinAtar"}
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 64, 128, 4, 8
LR, ANNEAL_ENV_STEPS, GAMMA, LAMBDA = 5e-3, 10_000_000, 0.99, 0.95
CLIP, ENT_COEF, VF_COEF, MAX_GRAD_NORM = 0.2, 0.01, 0.5, 0.5
BATCH = NUM_ENVS * NUM_STEPS
NUM_UPDATES = ANNEAL_ENV_STEPS // BATCH  # the horizon over which the learning rate falls to 0


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs, 64-64 ReLU, orthogonal init; returns (action logits, value)."""
    num_actions: int

    @nn.compact
    def __call__(self, x):
        """Map a batch of flat observations to logits [B, A] and values [B]."""
        def mlp(h, out, head_scale):
            """Two 64-unit ReLU layers and a linear head, orthogonally initialised, zero biases."""
            for _ in range(2):
                h = nn.relu(nn.Dense(64, kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                                     bias_init=nn.initializers.zeros)(h))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(head_scale),
                            bias_init=nn.initializers.zeros)(h)
        return mlp(x, self.num_actions, 0.01), mlp(x, 1, 1.0)[:, 0]


def lr_schedule(count):
    """PureJaxRL's linear annealing: lr falls by one step per update (EPOCHS x MINIBATCHES optimiser steps)."""
    return LR * (1.0 - (count // (EPOCHS * MINIBATCHES)) / NUM_UPDATES)


def make_update(env, env_params, net, tx):
    """Build the jitted update: rollout of NUM_STEPS vector steps, GAE, then EPOCHS x MINIBATCHES PPO steps."""
    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def flat(obs):
        """Flatten [N, 10, 10, C] observations to float32 [N, 100*C]."""
        return obs.reshape(obs.shape[0], -1).astype(jnp.float32)

    def init(rng):
        """Fresh params, optimiser state, env states, observations and per-env running episode returns."""
        rng, k_net, k_env = jax.random.split(rng, 3)
        obs, env_state = v_reset(jax.random.split(k_env, NUM_ENVS), env_params)
        params = net.init(k_net, flat(obs))
        return (params, tx.init(params), env_state, flat(obs), jnp.zeros(NUM_ENVS), rng)

    def env_step(carry, _):
        """One vector step: sample actions, step all envs, track episode returns (a tiny LogWrapper)."""
        params, env_state, obs, ep_ret, rng = carry
        rng, k_act, k_env = jax.random.split(rng, 3)
        logits, value = net.apply(params, obs)
        action = jax.random.categorical(k_act, logits)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=1)[:, 0]
        nobs, env_state, reward, term, trunc, _ = v_step(jax.random.split(k_env, NUM_ENVS), env_state, action,
                                                         env_params)
        done = jnp.logical_or(term, trunc)
        ep_ret = ep_ret + reward
        out = (obs, action, logp, value, reward, done, ep_ret)  # ep_ret here is the finished return where done
        ep_ret = jnp.where(done, 0.0, ep_ret)
        return (params, env_state, flat(nobs), ep_ret, rng), out

    def gae(values, rewards, dones, last_value):
        """Generalised advantage estimates and value targets, scanned backwards over time."""
        def back(carry, x):
            """One reverse step of the GAE recursion."""
            adv, next_value = carry
            value, reward, done = x
            nd = 1.0 - done
            delta = reward + GAMMA * next_value * nd - value
            adv = delta + GAMMA * LAMBDA * nd * adv
            return (adv, value), adv
        _, advs = jax.lax.scan(back, (jnp.zeros_like(last_value), last_value), (values, rewards, dones),
                               reverse=True)
        return advs, advs + values

    def loss_fn(params, mb):
        """PPO loss on one minibatch: clipped surrogate + clipped value loss - entropy bonus."""
        obs, action, old_logp, old_value, adv, target = mb
        logits, value = net.apply(params, obs)
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, action[:, None], axis=1)[:, 0]
        v_clipped = old_value + jnp.clip(value - old_value, -CLIP, CLIP)
        v_loss = 0.5 * jnp.maximum(jnp.square(value - target), jnp.square(v_clipped - target)).mean()
        ratio = jnp.exp(logp - old_logp)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - CLIP, 1.0 + CLIP) * adv).mean()
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
        return pg_loss + VF_COEF * v_loss - ENT_COEF * entropy

    def sgd_step(carry, mb):
        """One optimiser step on one minibatch."""
        params, opt_state = carry
        grads = jax.grad(loss_fn)(params, mb)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None

    def epoch(carry, _):
        """Shuffle the batch and run MINIBATCHES optimiser steps over it."""
        params, opt_state, batch, rng = carry
        rng, k = jax.random.split(rng)
        perm = jax.random.permutation(k, BATCH)
        mbs = jax.tree.map(lambda x: x[perm].reshape((MINIBATCHES, -1) + x.shape[1:]), batch)
        (params, opt_state), _ = jax.lax.scan(sgd_step, (params, opt_state), mbs)
        return (params, opt_state, batch, rng), None

    @jax.jit
    def update(state):
        """One PPO update; also returns per-step done flags and episode returns [NUM_STEPS, NUM_ENVS]."""
        params, opt_state, env_state, obs, ep_ret, rng = state
        (params, env_state, obs, ep_ret, rng), traj = jax.lax.scan(
            env_step, (params, env_state, obs, ep_ret, rng), None, NUM_STEPS)
        t_obs, t_act, t_logp, t_val, t_rew, t_done, t_ret = traj
        _, last_value = net.apply(params, obs)
        advs, targets = gae(t_val, t_rew, t_done.astype(jnp.float32), last_value)
        batch = jax.tree.map(lambda x: x.reshape((BATCH,) + x.shape[2:]),
                             (t_obs, t_act, t_logp, t_val, advs, targets))
        (params, opt_state, _, rng), _ = jax.lax.scan(epoch, (params, opt_state, batch, rng), None, EPOCHS)
        return (params, opt_state, env_state, obs, ep_ret, rng), (t_done, t_ret)

    return init, update


def main():
    """Parse the CLI, train until the target or the env-step budget, and print JSON lines."""
    # Default dispositions: the kernel ends the process at once, even mid-compile or mid-update.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--game", required=True, choices=sorted(GAMES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--max-env-steps", type=int, default=2_000_000)
    ap.add_argument("--json", action="store_true", help="accepted; output is always JSON lines")
    args = ap.parse_args()

    def emit(**obj):
        """Write one JSON object as a line on stdout, flushed."""
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    env, env_params = gymnax.make(GAMES[args.game])
    net = ActorCritic(env.num_actions)
    tx = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.adam(learning_rate=lr_schedule, eps=1e-5))
    init, update = make_update(env, env_params, net, tx)
    state = init(jax.random.PRNGKey(args.seed))
    recent = collections.deque(maxlen=100)
    env_steps, episodes, t_first_update, mean = 0, 0, None, None
    while env_steps < args.max_env_steps:
        state, (dones, rets) = update(state)
        dones, rets = jax.device_get((dones, rets))
        now = time.time()
        t_first_update = t_first_update or now
        env_steps += BATCH
        finished = rets[dones]  # time-major order: episodes in the order they ended
        recent.extend(finished.tolist())
        episodes += len(finished)
        mean = float(np.mean(recent)) if len(recent) == recent.maxlen else None
        emit(event="progress", env_steps=env_steps, return_mean=mean, episodes=episodes, t=now)
        if args.target is not None and mean is not None and mean >= args.target:
            emit(event="target", env_steps=env_steps, t=now, return_mean=mean, t_start=T_START,
                 t_first_update=t_first_update)
            return 0
    emit(event="end", env_steps=env_steps, return_mean=mean, t=time.time(), t_start=T_START,
         t_first_update=t_first_update)
    return 0


if __name__ == "__main__":
    sys.exit(main())
