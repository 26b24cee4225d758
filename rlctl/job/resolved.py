"""The job as plain data with every default filled in (what job.toml, checkpoints and TensorBoard keep), with the
hosts' `env` secrets masked; and those secrets put back from the run's private file."""

from __future__ import annotations

from typing import Any

from rlctl.job.spec import HOST_COUNT_KEYS, JobSpec


SECRET_MASK = "********"


def resolved_dict(spec: JobSpec) -> dict:
    """The job with every default filled in, as plain TOML-able data (None values dropped). `hosts[].env` values
    are secrets (tokens, passwords): masked here, so job.toml, checkpoints and TensorBoard never hold them; the
    run keeps them in its private secrets file (`host_secrets`, `with_host_secrets`)."""
    data = _drop_none(spec.model_dump(mode="json"))
    if data["hosts"] or spec.cluster.scheduler == "slurm":
        for key in HOST_COUNT_KEYS:  # set per host; writing the topology defaults would make the job invalid
            data["topology"].pop(key, None)
    if data["hosts"]:
        for host in data["hosts"]:
            host["env"] = {k: SECRET_MASK for k in host.get("env", {})}
    else:
        del data["hosts"]
    return data


def host_secrets(spec: JobSpec) -> dict[str, dict[str, str]]:
    """host name -> its `env` (the values resolved_dict masks)."""
    return {h.name: dict(h.env) for h in spec.hosts if h.env}


def with_host_secrets(spec: JobSpec, secrets: object) -> JobSpec:
    """The job with masked `hosts[].env` values filled in again from `secrets` (as host_secrets made it; anything
    else in it is ignored)."""
    if not isinstance(secrets, dict):
        return spec
    hosts = []
    for h in spec.hosts:
        given = secrets.get(h.name) if isinstance(secrets.get(h.name), dict) else {}
        env = {k: given[k] if v == SECRET_MASK and isinstance(given.get(k), str) else v for k, v in h.env.items()}
        hosts.append(h.model_copy(update={"env": env}))
    return spec.model_copy(update={"hosts": hosts})


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
