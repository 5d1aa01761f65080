"""No function in kvwatch/ is longer than 60 lines, bar an explicit, reasoned allow-list.

A function's length runs from its ``def`` line to the last line of its body (decorators excluded,
docstring and comments included). Methods and nested functions count on their own and are named by
their qualified name, e.g. ``kvwatch/sim/engine.py:Engine._step_start``.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 60

ALLOWED = {
    # Speed: the parser's hot loop runs per line of 100k-series bodies, and as one function its state
    # stays in fast locals (see the comment above it in kvwatch/parse.py for the benchmark to run).
    "kvwatch/parse.py:parse": "the parser's hot loop, kept whole for speed",
}


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function under ``node``, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def _lengths() -> dict[str, int]:
    out = {}
    for path in sorted((REPO / "kvwatch").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for name, lines in _functions(ast.parse(path.read_text(), filename=rel)):
            out[f"{rel}:{name}"] = max(lines, out.get(f"{rel}:{name}", 0))  # redefinitions: the longest
    return out


def test_counts_def_to_end_of_body_without_decorators():
    tree = ast.parse(
        "@decorator\n@another\ndef f():\n    x = 1\n\n    return x\n\n\nclass C:\n    def m(self):\n        pass\n"
    )
    assert dict(_functions(tree)) == {"f": 4, "C.m": 2}


def test_no_function_in_kvwatch_is_longer_than_60_lines():
    long = {k: n for k, n in _lengths().items() if n > MAX_LINES and k not in ALLOWED}
    assert not long, (
        f"functions longer than {MAX_LINES} lines (split them, or allow-list one with a reason): "
        + ", ".join(f"{k} ({n} lines)" for k, n in sorted(long.items()))
    )


def test_every_allow_listed_function_still_needs_it():
    lengths = _lengths()
    stale = [k for k in ALLOWED if lengths.get(k, 0) <= MAX_LINES]
    assert not stale, "allow-listed but missing or no longer over the limit, remove from ALLOWED: " + ", ".join(stale)


# The snapshot contract (kvwatch/snapshot.py): snapshot and history keys are Gauge / Counter / Hist members, never a
# bare string, so a typo cannot silently read None. Looked for: a string literal subscripting, or passed to .get() of,
# anything named gauges / counters / histograms / hists.
_SNAPSHOT_DICTS = {"gauges", "counters", "histograms", "hists"}


def _bare_string_keys(tree: ast.AST):
    for node in ast.walk(tree):
        target, key = None, None
        if isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, key = node.func.value, node.args[0] if node.args else None
        name = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
        if name in _SNAPSHOT_DICTS and isinstance(key, ast.Constant) and isinstance(key.value, str):
            yield node.lineno, key.value


def test_the_check_for_bare_snapshot_keys_finds_one():
    tree = ast.parse('x = p.gauges["requests_running"]\ny = snap.counters.get("preemptions")\nz = p.gauges[Gauge.X]')
    assert list(_bare_string_keys(tree)) == [(1, "requests_running"), (2, "preemptions")]


def test_no_snapshot_key_is_a_bare_string_in_kvwatch():
    found = [
        f"{path.relative_to(REPO).as_posix()}:{line} {key!r}"
        for path in sorted((REPO / "kvwatch").rglob("*.py"))
        for line, key in _bare_string_keys(ast.parse(path.read_text()))
    ]
    assert not found, "spell snapshot keys with kvwatch.snapshot's Gauge / Counter / Hist: " + ", ".join(found)
