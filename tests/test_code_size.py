"""Small parts: no class in rlctl/ over 250 lines and no function over 60, unless the line above its definition
says why (`# long: <reason>`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlctl"
LIMITS = {ast.ClassDef: 250, ast.FunctionDef: 60, ast.AsyncFunctionDef: 60}


def oversized(source: str) -> list[tuple[int, str, int]]:
    """(line, name, length) of every class or function in `source` past its limit without a `# long:` reason on the
    line above its definition (its first decorator's, if decorated)."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        limit = LIMITS.get(type(node))
        if limit is None:
            continue
        length = node.end_lineno - node.lineno + 1
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        excused = first >= 2 and lines[first - 2].strip().startswith("# long:")
        if length > limit and not excused:
            out.append((node.lineno, node.name, length))
    return out


def test_the_size_rule_finds_long_parts_and_honours_a_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert oversized(f"def f():\n{body}\n") == [(1, "f", 61)]
    assert oversized(f"# long: one table, read top to bottom\ndef f():\n{body}\n") == []
    assert oversized(f"def f():\n{body[:-len('    x59 = 59')].rstrip()}\n") == []


def test_no_class_over_250_lines_and_no_function_over_60_in_rlctl():
    offenders = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
                 for path in sorted(ROOT.rglob("*.py")) for line, name, length in oversized(path.read_text())]
    assert not offenders, "split these (or say why above the definition: # long: <reason>):\n" + "\n".join(offenders)


def test_run_statuses_are_named_once():
    """Run statuses are RunStatus's constants (rlctl.run_status); process states are ProcState's: no module spells
    one as a string of its own."""
    from rlctl.run_status import RunStatus

    names = {v for k, v in vars(RunStatus).items() if k.isupper()}
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name in ("run_status.py", "restart_policy.py"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        # A field named like a status (a host row's "running" count) is a key, not a status.
        keys = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys}
        keys |= {id(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "get"}
        offenders += [f"{path.relative_to(ROOT)}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and n.value in names and id(n) not in docstrings | keys]
    assert not offenders, offenders


def role_name_uses(source: str, roles: frozenset[str]) -> list[int]:
    """Lines where `source` compares, looks up or collects a role name spelled as a string of its own."""
    tree = ast.parse(source)
    found = set()

    def literals(node):
        items = node.elts if isinstance(node, (ast.Set, ast.Tuple, ast.List)) else [node]
        return [n for n in items if isinstance(n, ast.Constant) and n.value in roles]

    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            found.update(c.lineno for o in [n.left, *n.comparators] for c in literals(o))
        elif isinstance(n, ast.Subscript):
            found.update(c.lineno for c in literals(n.slice))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("set", "frozenset"):
            found.update(c.lineno for a in n.args for c in literals(a))
        elif isinstance(n, ast.Call) and "role" in ast.unparse(n.func).lower():
            found.update(c.lineno for a in n.args for c in literals(a))
    return sorted(found)


def test_role_names_are_named_once():
    """Roles are Role's constants (rlctl.role_names): no module compares, looks up or collects one spelled as a string
    of its own. The job schema (rlctl/job/) is left out: its `evaluator`, `learner` are keys of the job file."""
    from rlctl.role_names import ROLES

    for bad in ('ok = role == "learner"', 'x = {"a": 1}["collector"]', 'S = frozenset({"learner", "replay"})',
                'if p.role in ("evaluator", "x"): pass', 't.of_role("inference")'):
        assert role_name_uses(bad, ROLES), bad
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(ROOT.rglob("*.py"))
                 if path.name != "role_names.py" and path.relative_to(ROOT).parts[0] != "job"
                 for line in role_name_uses(path.read_text(), ROLES)]
    assert not offenders, offenders


def test_the_readme_code_map_names_the_tree():
    """Every file and folder the README's code map names exists, and every module of rlctl/ is named there (by its
    path, or by its name within its folder's row)."""
    readme = (ROOT.parent / "README.md").read_text()
    table = readme.split("## Code map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `rlctl/")]
    named = set()
    for row in rows:
        where, what = row.split(" | ", 2)[:2] if row.count(" | ") >= 2 else (row, "")
        first = where.strip("| `").split("`")[0]
        folder = first if first.endswith("/") else first.rsplit("/", 1)[0] + "/"
        if "<" in folder:  # a row about every package of a kind (rlctl/algos/<name>/)
            continue
        for name in re.findall(r"`([\w<>./]+)`", where + " | " + what):
            path = name if name.startswith("rlctl/") else folder + name
            if name.endswith((".py", "/")) and "<" not in name:
                assert (ROOT.parent / path).exists(), f"the code map names {path}, which is not in the tree"
                named.add(path)
    modules = {str(p.relative_to(ROOT.parent)) for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    modules |= {str(p.parent.relative_to(ROOT.parent)) + "/" for p in ROOT.glob("*/__init__.py")}
    assert modules <= named | {m for m in modules if any(n.startswith(m) for n in named)}, sorted(modules - named)
