"""`rlctl init`: a commented job file with every key at its default, rendered from the schema and valid as written.

Keys whose default is "unset" (TOML has no null) are written commented out; with `--hosts`, the per-host counts
move from `[topology]` into `[[hosts]]` tables (the first host runs the learner, its replay shard and the
evaluator; the others run collectors).
"""

from __future__ import annotations

import json
import re
import textwrap

from pydantic import BaseModel

from rlctl.job import spec
from rlctl.job.jobref import SECTIONS

WIDTH = 118
HOST_COUNTS = {"learner_procs", "collectors", "replay_shards", "evaluator"}  # [topology] keys [[hosts]] take over


def _toml(value) -> str:
    """A default as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(text: str, indent: str = "# ") -> list[str]:
    return textwrap.wrap(" ".join(text.split()), WIDTH - len(indent), initial_indent=indent,
                         subsequent_indent=indent, break_on_hyphens=False)


def _section(header: str, model: type[BaseModel], values: dict, skip: tuple[str, ...] = (),
             commented: frozenset[str] = frozenset()) -> list[str]:
    """One table: its doc line, then each key's doc and `key = value` (given, else the default)."""
    out = [*_comment((model.__doc__ or "").strip().splitlines()[0]), header]
    fields = model.model_fields
    for name in [*(k for k in fields if k in values), *(k for k in fields if k not in values)]:  # given keys first
        field = fields[name]
        if name in skip:
            continue
        out += _comment(field.description or "")
        value = values.get(name, field.default)
        if name in values or not (field.is_required() or value is None or isinstance(value, BaseModel)):
            line = f"{name} = {_toml(value.model_dump() if isinstance(value, BaseModel) else value)}"
            out.append(f"# {line}" if name in commented else line)
        else:
            out.append(f"# {name} =")
    return out + [""]


def _host_name(destination: str, i: int) -> str:
    """A host's short name from its SSH destination (`user@box.example:22` -> `box`)."""
    base = destination.rsplit("@", 1)[-1].split(".", 1)[0].split(":", 1)[0]
    return base if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", base or "") else f"host{i}"


def render_job_file(algo: str | None = None, env_id: str = "CartPole-v1", hosts: list[str] | None = None) -> str:
    """The job file text (every section; `[replay]` only for replay algorithms); `algo` defaults to the first
    registered algorithm."""
    algo = algo or spec.ALGORITHM_NAMES[0]
    if algo not in spec.ALGORITHM_SPECS:
        raise ValueError(f"unknown algorithm {algo!r} (one of {', '.join(spec.ALGORITHM_NAMES)})")
    from rlctl.algos import ALGORITHMS
    from rlctl.datapaths import DATA_PATHS

    path = ALGORITHMS[algo].data_path
    path_sections = {f"[{name}]" for p in DATA_PATHS.values() for name in p.sections}  # left out for other paths
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{algo}-{env_id.split('/')[-1]}".lower()).strip("-.") or algo
    values = {
        "[job]": {"name": name[:64]},
        "[job.stop]": {"wall_s": 3600.0},
        "[env]": {"id": env_id},
    }
    out = [f"# {algo} on {env_id}: every key of the job file at its default (`rlctl init`). Keys left as `# key =`",
           "# are unset; delete what you do not change. Check it with `rlctl validate FILE`, see it with `rlctl plan`.",
           ""]
    for header, model, skip in SECTIONS:
        if header.startswith("[algorithm]"):
            if model is not spec.ALGORITHM_SPECS[algo]:
                continue
            out += _section("[algorithm]", model, {"name": algo})
        elif header.startswith("[[hosts]]"):
            for i, destination in enumerate(hosts or []):
                role = ({"learner": True, "evaluator": True, "replay_shards": 1 if path.shard_role else 0} if i == 0
                        else {"collectors": 2})
                out += _section("[[hosts]]", model, {"name": _host_name(destination, i), "address": destination,
                                                    **role})
        elif header in path_sections and header[1:-1] not in path.sections:
            continue
        elif header.endswith("(optional)"):  # a table to add when wanted: all of it commented out
            lines = _section(header.split(" (")[0], model, {"project": "my-project"}, skip)
            out += [line if line.startswith("# ") or not line else f"# {line}" for line in lines]
        else:
            commented = frozenset(HOST_COUNTS) if header == "[topology]" and hosts else frozenset()
            out += _section(header, model, values.get(header, {}), skip, commented)
    return "\n".join(out).rstrip() + "\n"
