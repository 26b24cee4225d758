"""Data paths are plug-ins (rlctl.datapaths): only their package knows them by name, each algorithm's section has
what its path reads, and the plan's ports are the path's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlctl.algos import ALGORITHMS, AlgorithmEntry
from rlctl.datapaths import DATA_PATHS
from rlctl.launch.plan import make_plan
from rlctl.job.specbase import Section
from rlctl.job.load import validate_job
from rlctl.job.spec import ALGORITHM_SPECS

ROOT = Path(__file__).resolve().parents[1] / "rlctl"
PATH_NAMES = set(DATA_PATHS)
PATH_SYMBOLS = {"REPLAY", "ROLLOUTS", "uses_replay"}


def _names_a_path(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in PATH_NAMES
    if isinstance(node, ast.Name):
        return node.id in PATH_SYMBOLS
    if isinstance(node, ast.Attribute):
        return node.attr in PATH_SYMBOLS
    return False


def data_path_comparisons(source: str) -> list[int]:
    """Lines of `source` that compare with a data path's name (`x == "replay"`, `data != ROLLOUTS`,
    `name in ("replay", ...)`) or read a name-based trait (`uses_replay`)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
            if any(_names_a_path(o) for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Name, ast.Attribute)) and _names_a_path(node):
            lines.append(node.lineno)
    return lines


def test_the_guard_catches_each_form_of_branching_on_a_path():
    for branch in ('if job.algo.data == "replay": pass', 'ok = "rollouts" != kind', 'x = name in ("replay", "y")',
                   "if spec.algo.uses_replay: pass", "from rlctl.datapaths import REPLAY\nok = data == REPLAY"):
        assert data_path_comparisons(branch), branch
    assert not data_path_comparisons('path = job.data_path\nif path.shard_role: pass\nok = role == "learner"')


def test_no_module_outside_the_data_path_package_branches_on_a_path_name():
    """Every module outside rlctl/datapaths calls the job's data path instead of comparing its name (the registry
    may name a path for each algorithm; it compares none)."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "datapaths" or rel == Path("algos/__init__.py"):
            continue
        offenders += [f"{rel}:{line}" for line in data_path_comparisons(path.read_text())]
    assert not offenders, offenders
    registry = (ROOT / "algos" / "__init__.py").read_text()
    assert not [n for n in ast.walk(ast.parse(registry)) if isinstance(n, ast.Compare)
                and any(_names_a_path(o) for o in [n.left, *n.comparators])]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_section_has_what_its_data_path_reads(name):
    entry = ALGORITHMS[name]
    section = ALGORITHM_SPECS[name]
    entry.data_path.check_section(entry, section)  # what spec.py runs when the registry loads
    job = validate_job({"job": {"name": "t"}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": name}})
    fields, methods = entry.data_path.requirements(entry)
    for field in fields:
        assert hasattr(job.algorithm, field)
    for method in methods:
        assert callable(getattr(job.algorithm, method))


def test_a_section_missing_a_path_field_is_a_registry_error_naming_it():
    class Thin(Section):
        """An algorithm section without what the replay path reads."""

        name: str = "thin"
        lr: float = 1e-3

    entry = AlgorithmEntry("thin", "", "", "", "", "replay")
    with pytest.raises(TypeError, match=r"algorithm 'thin'.*Thin lacks batch_size, prefetch.*'replay' data path"):
        DATA_PATHS["replay"].check_section(entry, Thin)
    with pytest.raises(TypeError, match=r"lacks rollout_len, max_policy_lag, rollouts_per_update"):
        DATA_PATHS["rollouts"].check_section(entry, Thin)
    with pytest.raises(TypeError, match=r"lacks rollout_len, which"):
        DATA_PATHS["rollouts"].check_section(AlgorithmEntry("thin", "", "", "", "", "rollouts", synchronous=True), Thin)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_plan_binds_the_data_paths_ports_and_starts_its_processes(name):
    job = validate_job({"job": {"name": "t"}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": name},
                        "topology": {"learner_procs": 2, "collectors": 2}})
    path = job.data_path
    plan = make_plan(job, "run-1", "/tmp/run-1", 40000)
    groups, per_group = path.port_groups(job)
    data_ports = set(range(40003, 40003 + groups * per_group))
    assert data_ports <= set(plan.ports())
    shards = [p for p in plan.processes if path.shard_role and p.role == path.shard_role]
    assert len(shards) == job.replay_shard_count == path.shard_count(job)
    learner_binds = {k for p in plan.processes if p.role == "learner" for k in p.binds}
    own = set(path.plan(job, [], [], str, str).endpoints)  # the endpoint names the path publishes
    assert own <= set(plan.endpoints)
    assert bool(shards) != any(k.startswith("rollouts-") for k in learner_binds)
