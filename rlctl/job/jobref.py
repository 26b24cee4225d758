"""The job-file reference (every section and key, with defaults), rendered from the schema's field docstrings.

`python -m rlctl.job.jobref` prints it, `python -m rlctl.job.jobref --write README.md` renews the README's copy, and a test
keeps the two equal.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from rlctl.job import spec

SECTIONS = [
    ("[job]", spec.JobSection, ("stop",)),
    ("[job.stop]", spec.StopSpec, ()),
    ("[env]", spec.EnvSpec, ("atari",)),
    ("[env.atari]", spec.AtariPresetSpec, ()),
    *((f'[algorithm] name = "{name}"', model, ("name",)) for name, model in spec.ALGORITHM_SPECS.items()),
    ("[model]", spec.ModelSpec, ()),
    ("[replay]", spec.ReplaySpec, ()),
    ("[topology]", spec.TopologySpec, ()),
    ("[inference]", spec.InferenceSpec, ()),
    ("[evaluator]", spec.EvaluatorSpec, ()),
    ("[logging]", spec.LoggingSpec, ("wandb",)),
    ("[logging.wandb] (optional)", spec.WandbSpec, ()),
    ("[network]", spec.NetworkSpec, ()),
    ("[[hosts]] (optional; without it everything runs on this machine)", spec.HostSpec, ()),
]


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " \\| ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default
    if value is None:
        return "-"
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def render_reference() -> str:
    """Markdown tables, one per section."""
    out = []
    for title, model, skip in SECTIONS:
        out.append(f"**{title}** — {(model.__doc__ or '').strip().splitlines()[0]}\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            if name in skip:
                continue
            doc = " ".join((field.description or "").split()).replace("|", "\\|")
            out.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {doc} |")
        out.append("")
    return "\n".join(out)


START, END = "<!-- job-reference:start -->\n", "<!-- job-reference:end -->"


def write_into(readme: Path) -> None:
    """Replace the reference between the README's job-reference markers with the current one."""
    text = readme.read_text()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    readme.write_text(f"{head}{START}{render_reference().strip()}\n{END}{tail}")


if __name__ == "__main__":
    # `python -m rlctl.job.jobref` prints the reference; `python -m rlctl.job.jobref --write README.md` renews the README's.
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_into(Path(sys.argv[2]))
    else:
        print(render_reference())
