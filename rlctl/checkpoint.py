"""Checkpoints: model + optimizer + counters, written durably (rlctl.durable); newest kept plus every Kth."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rlctl.durable import remove_temporaries, replace_file

if TYPE_CHECKING:
    import torch

# torch and gymnasium are imported where they are used: `rlctl eval` of a file that is plainly no checkpoint says so
# before paying for them.
FORMAT = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
PICKLE_MAGIC = b"\x80"  # ... or, in its legacy format, a pickle (protocol 2 and later)


class CheckpointError(Exception):
    """A checkpoint that cannot be read or used."""


def save_checkpoint(directory: str | Path, payload: dict, name: str = "latest.pt", index: int = 0,
                    keep_every: int = 0) -> Path:
    """Write `name` durably; also keep `ckpt-<index>.pt` when index is a multiple of keep_every."""
    import torch

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    numbered = d / f"ckpt-{index:06d}.pt" if keep_every and index % keep_every == 0 else None
    return replace_file(d / name, lambda f: torch.save({"format": FORMAT, **payload}, f), link_also=numbered)


def newest_checkpoint(directory: str | Path, name: str = "latest.pt") -> dict | None:
    """The newest readable checkpoint in `directory` (`name`, else the highest numbered one), or None; temporary
    files of killed writers are removed first."""
    d = Path(directory)
    remove_temporaries(d)
    candidates = [d / name] + sorted(d.glob("ckpt-*.pt"), reverse=True)
    for path in candidates:
        if path.is_file():
            try:
                return {**load_checkpoint(path), "path": str(path)}
            except CheckpointError as exc:
                print(f"skipping checkpoint {path}: {exc}", flush=True)
    return None


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint (tensors and plain data only: no pickled code is executed)."""
    plainly_not = _not_a_checkpoint(path)
    if plainly_not:
        raise CheckpointError(plainly_not)
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise CheckpointError(f"cannot read checkpoint: {_load_error(path, exc)}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError("not an rlctl checkpoint")
    return data


def _not_a_checkpoint(path: str | Path) -> str | None:
    """Why a file is plainly no checkpoint, from its first bytes (what it is instead where that is clear), or None
    when torch.load is to judge."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        return f"cannot read checkpoint: {exc.strerror or exc}"
    if not head:
        return "cannot read checkpoint: the file is empty"
    if head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        return None
    give = "give a run (id or prefix) or a checkpoint file (a run's checkpoints/*.pt)"
    if Path(path).suffix == ".toml" or re.search(rb"^\s*\[job\]", head, re.M):
        return f"a job file, not a checkpoint: {give}; a job file goes with --job"
    return f"not a checkpoint (torch.save writes a zip archive, and this file is none): {give}"


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (torch's and pydantic's span several), control characters escaped (the
    message may quote the file's own text)."""
    text = " ".join(str(exc).split())
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text) or type(exc).__name__


def _load_error(path: str | Path, exc: BaseException) -> str:
    """torch.load's reason, on one line. Its weights-only refusal is paragraphs of advice to load with
    weights_only=False (which would run the file's pickled code): keep only what it found."""
    text = str(exc)
    if "Weights only load failed" in text:
        found = re.search(r"WeightsUnpickler error:\s*(.*?)\s*(?:Please use|Check the documentation|$)", text, re.S)
        detail = _one_line(Exception(found.group(1))).rstrip(".") if found else ""
        return "not a file of tensors and plain data" + (f" ({detail})" if detail else "")
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        head = None
    if head == b"":
        return "the file is empty"
    reason = _one_line(exc).split(". ")[0].rstrip(".")  # torch goes on about internal miniz errors
    if head == b"PK":  # torch.save writes a zip archive
        return f"the archive is damaged or truncated ({reason})"
    return reason


# Where a job's [env] makes gymnasium or rlctl import and call code by name. A checkpoint is data from wherever the
# file came from, so `rlctl eval` of a bare checkpoint refuses these unless the user trusts it (UntrustedCheckpoint):
#   - env.id "module:attr" (rlctl imports the module; gymnasium's own "module:Env-v0" form imports it too);
#   - env.wrappers "module:Class", but for rlctl's own below (rlctl.envs is imported anyway; MaskVelocity only indexes
#     observations);
#   - gymnasium's compatibility envs, which make another library's env by the name in their kwargs (`env_id`,
#     "module:Env" imports there as well);
#   - env.kwargs.vector_kwargs, which gymnasium hands to the vector env itself, not to the env (AsyncVectorEnv takes a
#     `worker` callable; a checkpoint holds no callables, but nothing of that kind is the checkpoint's to choose).
# What stays allowed is a registered id (gymnasium's registry: code installed here, under names its packages chose)
# with the checkpoint's env.kwargs. Those kwargs go to that env's own constructor as plain data (numbers, strings,
# lists, tables: weights_only loading holds nothing callable), so they reach code only through what an installed
# constructor does with them; the one known to import by a name it is given (the compatibility envs) is refused
# above. vectorization = "vector_entry_point" uses the registry's own vector entry point.
SAFE_WRAPPERS = frozenset({"rlctl.envs:MaskVelocity"})
COMPAT_ENVS = frozenset({"GymV21Environment", "GymV26Environment"})


class UntrustedCheckpoint(CheckpointError):
    """A checkpoint whose stored job names code to import, evaluated without the user's say-so."""


def code_named_by(env) -> list[str]:
    """What making `env` (an EnvSpec) would import or call by a name the job itself gives, as "key value" strings;
    empty when it only makes a registered env (see above)."""
    named = []
    if ":" in env.id:
        named.append(f"env.id = {env.id!r}")
    elif env.id.split("/")[-1].split("-v")[0] in COMPAT_ENVS:
        named.append(f"env.id = {env.id!r} (makes the env its kwargs name)")
    named += [f"env.wrappers[{i}] = {w.name!r}" for i, w in enumerate(env.wrappers) if w.name not in SAFE_WRAPPERS]
    if "vector_kwargs" in env.kwargs:
        named.append("env.kwargs.vector_kwargs")
    return named


def _record(data: dict, key: str) -> object:
    if key not in data:
        raise CheckpointError(f"checkpoint has no {key!r} record")
    return data[key]


def evaluate_checkpoint(path: str | Path, episodes: int, seed: int, job=None, trust_checkpoint: bool = False,
                        video_dir: str | None = None, stochastic: bool = False,
                        progress: Callable[[int, int], None] | None = None) -> dict:
    """Episodes with a checkpoint's policy, greedy (or, `stochastic`, with actions sampled from a policy network);
    returns mean/std/min/max return and lengths. `progress(episodes done, env steps)` is called every step.

    `job` (a JobSpec: the run directory's job.toml, a --job file) is what the env and the network are made from; its
    entry points are the user's own. Without it the job stored in the checkpoint is used, and whatever code that names
    (code_named_by) is refused with UntrustedCheckpoint unless `trust_checkpoint`. Every way the file can be unusable
    (unreadable, records missing or malformed, weights that do not fit, an env that cannot be made or whose spaces are
    not the checkpoint's) is a CheckpointError with a one-line reason.
    """
    data = load_checkpoint(path)  # first: a file that is no checkpoint is refused before torch is imported
    import gymnasium as gym
    import torch

    from rlctl.roles.evaluator import greedy_episodes

    if job is None:
        job = _stored_job(data, trust_checkpoint)
    model, updates = _policy(data, job)
    if stochastic and not hasattr(model, "sample"):
        raise CheckpointError(f"--stochastic samples a policy network's actions (ppo, appo, impala); "
                              f"{job.algorithm.name}'s network gives Q-values, acted on greedily")
    torch.manual_seed(seed)  # the sampled actions of --stochastic repeat with the seed
    try:
        returns, lengths = greedy_episodes(model, job.env, episodes, seed, job.algorithm_entry.recurrent,
                                           video_dir=video_dir, stochastic=stochastic, progress=progress)
    except gym.error.DependencyNotInstalled as exc:  # RecordVideo without moviepy
        raise CheckpointError(f"cannot record video: {_one_line(exc)} (pip install -e '.[video]')") from None
    out = {"checkpoint": str(path), "updates": updates, "episodes": episodes, "stochastic": stochastic,
           "return_mean": float(returns.mean()), "return_std": float(returns.std()),
           "return_min": float(returns.min()), "return_max": float(returns.max()),
           "length_mean": float(lengths.mean()), "returns": [float(r) for r in returns],
           "lengths": [int(n) for n in lengths]}
    if video_dir is not None:
        out["videos"] = [str(Path(video_dir) / f"episode-{i}.mp4") for i in range(episodes)]
    return out


def _stored_job(data: dict, trust_checkpoint: bool):
    """The job a checkpoint holds, validated like a job file; UntrustedCheckpoint if it names code to import and
    the user did not say they trust the file."""
    from rlctl.job.load import JobFileError, validate_job

    stored = _record(data, "job")
    if not isinstance(stored, dict):
        raise CheckpointError(f"its 'job' record is a {type(stored).__name__}, not a table")
    try:
        job = validate_job(stored, "job")
    except JobFileError as exc:
        problems = "; ".join(f"{key}: {reason}" if key else reason for key, reason in exc.problems)
        raise CheckpointError(f"its job is not valid: {_one_line(Exception(problems))}") from None
    named = [] if trust_checkpoint else code_named_by(job.env)
    if named:
        raise UntrustedCheckpoint(
            f"its job names code to import ({', '.join(named)}), which rlctl eval does not run from a checkpoint "
            "file: pass --job FILE (a job file of yours for the env) or, if you trust where the file came from, "
            "--trust-checkpoint")
    return job


def _policy(data: dict, job) -> tuple[torch.nn.Module, int]:
    """(the job's network with the checkpoint's weights loaded, the checkpoint's update count); CheckpointError
    unless the file's records, the env the job makes and the weights all fit together."""
    from rlctl.algos import build_model
    from rlctl.envs import EnvStartError, SpaceInfo, probe_space_info

    if "space" not in data:
        raise CheckpointError("checkpoint has no 'space' record (written by an older rlctl)")
    try:
        info = SpaceInfo.from_dict(data["space"])
    except Exception as exc:  # a dict of the wrong shape: KeyError, TypeError, ValueError...
        raise CheckpointError(f"its 'space' record is malformed ({type(exc).__name__}: {_one_line(exc)})") from None
    state = _record(data, "model")
    if not isinstance(state, dict):
        raise CheckpointError(f"its 'model' record is a {type(state).__name__}, not a state dict")
    try:
        updates = int(data.get("updates", 0))
    except (TypeError, ValueError):
        raise CheckpointError(f"its 'updates' record is not a count (a {type(data['updates']).__name__})") from None
    try:
        made = probe_space_info(job.env)
    except EnvStartError as exc:  # its message names the env and the cause
        raise CheckpointError(f"cannot make the env: {exc}") from None
    except Exception as exc:  # anything else of the env's own: any type
        raise CheckpointError(f"cannot make env {job.env.id!r} ({type(exc).__name__}: {_one_line(exc)})") from None
    # Everything below allocates what the file declares: the env's own spaces and the weights the file holds bound it.
    if (made.obs_shape, made.n_actions, made.action_shape) != (info.obs_shape, info.n_actions, info.action_shape):
        raise CheckpointError(f"env {job.env.id!r} has {_spaces(made)}; the checkpoint's network was made for "
                              f"{_spaces(info)}")
    _check_weight_shapes(job, made, state)
    try:
        model = build_model(job, made)
    except Exception as exc:  # torch and numpy raise many types
        raise CheckpointError(f"cannot build the {job.algorithm.name} network for its spaces "
                              f"({type(exc).__name__}: {_one_line(exc)})") from None
    try:
        model.load_state_dict(state)
    except Exception as exc:  # RuntimeError: values that are not tensors, dtypes torch cannot copy
        raise CheckpointError(f"its weights do not fit the job's network ({_one_line(exc)})") from None
    return model, updates


def _check_weight_shapes(job, info, state: dict) -> None:
    """Refuse weights whose names or shapes are not those of the job's network, before that network is built: it is
    built on torch's meta device first (no memory), so a stored job declaring a huge network allocates nothing, and
    the real one is then no larger than the weights already read from the file."""
    import torch

    from rlctl.algos import build_model

    try:
        with torch.device("meta"):
            shell = build_model(job, info)
    except Exception as exc:  # the job's own model settings: torch raises many types
        raise CheckpointError(f"cannot build the {job.algorithm.name} network for its spaces "
                              f"({type(exc).__name__}: {_one_line(exc)})") from None
    want = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    have = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in state.items()}
    if want == have:
        return
    missing, unexpected = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing or unexpected:
        reason = (f"missing {_names(missing)}" if missing else "") + ("; " if missing and unexpected else "") + \
                 (f"unexpected {_names(unexpected)}" if unexpected else "")
    else:
        key = next(k for k in want if want[k] != have[k])
        found = "not a tensor" if have[key] is None else f"shaped {list(have[key])}"
        reason = f"{_names([key])} is {found}, the network's is shaped {list(want[key])}"
    raise CheckpointError(f"its weights do not fit the job's network ({reason})")


def _names(keys: list) -> str:
    """A few state-dict keys for a message (a hostile file may hold thousands, named anything)."""
    shown = ", ".join(_one_line(Exception(repr(k)))[:80] for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _spaces(info) -> str:
    """Spaces for a message; shapes cut to 8 dimensions (a file's may list any number)."""
    actions = f"{info.n_actions} actions" if info.discrete else f"actions shaped {list(info.action_shape[:8])}"
    return f"observations shaped {list(info.obs_shape[:8])} and {actions}"
