"""Env ids gymnasium knows: the ids of env packages (ale-py, MinAtar) and why an id cannot be made. gymnasium is
imported inside the functions, so commands that never load a job stay light."""

from __future__ import annotations

import difflib


# Packages whose gymnasium ids rlctl registers, by id namespace: (top-level module, the rlctl extra that installs it).
ENV_PACKAGES = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar", "minatar")}


def register_env_packages() -> None:
    """Register the ids of the installed env packages (ale-py, MinAtar); missing ones are skipped."""
    import gymnasium

    try:
        import ale_py
    except ImportError:
        pass
    else:
        gymnasium.register_envs(ale_py)
    if _installed("minatar"):
        _register_minatar_ids(gymnasium)


def _installed(module: str) -> bool:
    """Whether a top-level module can be imported, without importing it."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _register_minatar_ids(gymnasium) -> None:
    """MinAtar's ids, as minatar.gym.register_envs() registers them, without importing the package.

    Its __init__ imports its display (seaborn, matplotlib, scipy): 2.6 s in every process of a MinAtar job. The ids
    get rlctl's vectorized ports as their vector entry point; a single env (gymnasium.make) still loads MinAtar's own
    class, through the entry point, where one is made.
    """
    from rlctl.minatar_vec import GAME_CLASSES, attach_vector_entry_points

    for game in GAME_CLASSES:
        name = game.title().replace("_", "")
        for version, minimal in (("v0", False), ("v1", True)):
            if f"MinAtar/{name}-{version}" not in gymnasium.registry:
                gymnasium.register(id=f"MinAtar/{name}-{version}", entry_point="minatar.gym:BaseEnv",
                                   kwargs={"game": game, "use_minimal_action_set": minimal})
    attach_vector_entry_points(gymnasium.registry)  # its games stepped as arrays (vectorization = "auto")


def env_id_problem(env_id: str) -> str | None:
    """Why a registered-style env id (no `module:` part) cannot be made, or None when gymnasium knows it.

    Asks `gymnasium.spec`, as rlctl.envs does before making the env; gymnasium is imported here, not when this module
    is, so commands that never load a job stay light.
    """
    try:
        import gymnasium
    except ImportError:  # pragma: no cover - a dependency; without it the env fails where it is made
        return None
    try:
        try:
            gymnasium.spec(env_id)
        except Exception:
            register_env_packages()  # ALE and MinAtar ids exist once registered
            gymnasium.spec(env_id)
    except Exception:  # gymnasium.error.Error and kin: unregistered, malformed, unknown namespace or version
        namespace = env_id.split("/")[0] if "/" in env_id else ("ALE" if "NoFrameskip" in env_id else "")
        package = ENV_PACKAGES.get(namespace)
        if package is not None and not _installed(package[0]):
            return f"not registered in gymnasium; its package is an extra: pip install -e '.[{package[1]}]'"
        hint = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1, cutoff=0.6)
        if hint:
            return f"not registered in gymnasium; did you mean {hint[0]!r}?"
        return "not registered in gymnasium; for an env of another package give its entry point `module:attr`"
    return None
