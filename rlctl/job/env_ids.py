"""Env ids gymnasium knows: the packages that register ids when imported (ale-py, MinAtar) and why an id cannot be
made. gymnasium is imported inside the functions, so commands that never load a job stay light."""

from __future__ import annotations

import difflib


# Packages that register gymnasium ids when imported (and the rlctl extra that installs each), by id namespace.
ENV_PACKAGES = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar.gym", "minatar")}


ENV_EXTRAS = {ns: extra for ns, (_, extra) in ENV_PACKAGES.items()}


def register_env_packages() -> None:
    """Import the installed env packages that register gymnasium ids (ale-py, MinAtar); missing ones are skipped."""
    import importlib

    import gymnasium

    for module, _ in ENV_PACKAGES.values():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if module == "ale_py":
            gymnasium.register_envs(mod)
        else:
            if "MinAtar/Breakout-v1" not in gymnasium.registry:
                mod.register_envs()  # MinAtar registers its ids only when asked
            from rlctl.minatar_vec import attach_vector_entry_points

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
            register_env_packages()  # ALE and MinAtar ids exist once their packages are imported
            gymnasium.spec(env_id)
    except Exception:  # gymnasium.error.Error and kin: unregistered, malformed, unknown namespace or version
        extra = ENV_EXTRAS.get(env_id.split("/")[0] if "/" in env_id else ("ALE" if "NoFrameskip" in env_id else ""))
        if extra:
            return f"not registered in gymnasium; its package is an extra: pip install -e '.[{extra}]'"
        hint = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1, cutoff=0.6)
        if hint:
            return f"not registered in gymnasium; did you mean {hint[0]!r}?"
        return "not registered in gymnasium; for an env of another package give its entry point `module:attr`"
    return None
