"""The catalogue is the one vocabulary: nothing in kvwatch/ spells a bottleneck or an action by hand, the
collector builds exactly its families, and the docs' tables are generated from it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from operator import attrgetter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.catalog import FAMILIES, Action, Bottleneck, KvPressure, Thresholds, most_severe
from kvwatch.diagnose import RULES, SENTENCES, Hints, diagnose_engine
from kvwatch.engines import ENGINES
from kvwatch.engines.vllm import ENGINE as VLLM
from kvwatch.export import KvwatchCollector
from kvwatch.state import Target
from kvwatch.window import QueueSignals, Signals
from tests.helpers.recordings import FIXTURES

REPO = Path(__file__).resolve().parents[1]
NAMES = {str(x) for x in (*Bottleneck, *Action)}
# Also vLLM config keys, or Grafana's unit "none": a list of them alone is no offence.
FLAG_NAMES = {"max_num_seqs", "max_loras", "enable_prefix_caching", "none"}


def _literal_names(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in NAMES]


def _mentions(node: ast.AST, words=("bottleneck", "action")) -> bool:
    text = ast.unparse(node).lower()
    return any(w in text for w in words)


_SELECTOR = re.compile(r'(?:bottleneck|action)=\\?"([a-z0-9_]+)\\?"')


def spelled_by_hand(source: str) -> list[tuple[int, str]]:
    """Bottleneck or action names written as string literals where code decides by them: compared with
    something named bottleneck/action, collected two or more together, or passed to ``Bottleneck()`` /
    ``Action()``. (``max_num_seqs`` is also a flag's name, so a lone literal is not an offence.)"""
    found = []
    tree = ast.parse(source)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and _mentions(node):
            found += [(node.lineno, v) for v in _literal_names(node)]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(names := _literal_names(node)) >= 2:
            if set(names) - FLAG_NAMES:
                found += [(node.lineno, v) for v in names]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("Bottleneck", "Action"):
            found += [(node.lineno, v) for v in _literal_names(node)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            # a label selector spelled in a string (a regex, a query)
            found += [(node.lineno, v) for v in _SELECTOR.findall(node.value) if v in NAMES]
    return found


def test_no_bottleneck_or_action_is_spelled_outside_the_catalogue():
    code = [p for d in ("kvwatch", "bench", "grafana", "docs", "alerts") for p in sorted((REPO / d).rglob("*.py"))]
    offences = [
        f"{p.relative_to(REPO)}:{line}: {name!r}"
        for p in code
        if p.name != "catalog.py"
        for line, name in spelled_by_hand(p.read_text())
    ]
    assert not offences, "use kvwatch.catalog's enums:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    "code",
    [
        'if d.bottleneck == "kv_cache": pass',
        'x = d["bottleneck"] in ("none", "idle")',
        'LIMITS = ("kv_cache", "max_num_seqs")',
        'b = Bottleneck("stalled")',
        'if r.action != "add_replica": pass',
        """RE = r'^kvwatch_bottleneck\\{bottleneck="kv_cache",[^}]*\\} 1$' """,
    ],
)
def test_the_literal_check_catches_each_way_of_spelling_a_name(code):
    assert spelled_by_hand(code)


def test_a_flag_named_like_a_bottleneck_is_not_an_offence():
    assert not spelled_by_hand('seqs = config.get("max_num_seqs")\nkeys = ("max_num_seqs", "enable_prefix_caching")')


def test_severity_and_cost_orders():
    assert most_severe(["none", "kv_cache", "token_budget"]) is Bottleneck.KV_CACHE
    assert most_severe([]) is Bottleneck.IDLE
    assert Bottleneck.STALLED.severity == max(b.severity for b in Bottleneck)
    assert list(Action)[0] is Action.FP8_KV_CACHE and list(Action)[-1] is Action.RESTART_ENGINE
    assert all(b.colour and b.label and b.meaning for b in Bottleneck)
    assert all(a.meaning for a in Action)
    assert all(e.flag(a) for e in ENGINES for a in Action)  # every engine spells every action
    assert [k.colour for k in KvPressure] == ["green", "orange", "red"]


def test_every_family_signal_path_resolves_and_names_are_prometheus_style():
    s = Signals("m", "0", 0.0, 1, 0.0)
    for f in FAMILIES:
        assert f.name.startswith("kvwatch_") and not f.name.endswith("_total"), f.name
        assert f.type in ("gauge", "counter") and f.help.endswith(".") and f.unit
        if f.signal:
            attrgetter(f.signal)(s)  # raises if the path is wrong
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_the_collector_exports_exactly_the_catalogue():
    t = Target("http://x:1/metrics")
    files = sorted((FIXTURES / "kv_cache").glob("*.prom"), key=lambda p: float(p.name[:-5]))[:25]
    for f in files:
        tt = float(f.name[:-5])
        t.observe_body(tt, f.read_text())
        t.up, t.diagnosis = True, t.diagnose(tt)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(KvwatchCollector(lambda: [t]))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert set(fams) == {f.name for f in FAMILIES}
    for f in FAMILIES:
        assert fams[f.name].type == f.type and fams[f.name].documentation == f.help
        for sample in fams[f.name].samples:
            assert set(sample.labels) == set(f.labels), (f.name, sample.labels)


def test_every_bottleneck_is_reachable_by_a_rule_and_sentences_are_used():
    # Each bottleneck but unreachable (the target's, not an engine's) is the verdict of some rule.
    source = Path(sys.modules[RULES[0].__module__].__file__).read_text()
    named = {b for b in Bottleneck if f"Bottleneck.{b.name}" in source}
    assert named == set(Bottleneck) - {Bottleneck.UNREACHABLE}
    for key in SENTENCES:
        assert f'"{key}"' in source.replace(f'"{key}": ', "", 1), f"sentence {key!r} is never said"
    nothing = Signals("m", "0", 0.0, 1, 0.0, queue=QueueSignals(running=0.0, waiting=0.0))
    assert diagnose_engine(nothing, Hints(), Thresholds()).bottleneck is Bottleneck.IDLE
    # No request count at all is unknown, not zero (SGLang's published docs dump: KV and tokens, no request gauge).
    unknown = diagnose_engine(Signals("m", "0", 0.0, 1, 0.0), Hints(), Thresholds())
    assert unknown.bottleneck is Bottleneck.UNDETERMINED


def test_docs_tables_are_generated_from_the_catalogue():
    r = subprocess.run([sys.executable, str(REPO / "docs" / "generate.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    metrics = (REPO / "docs" / "metrics.md").read_text()
    for f in FAMILIES:
        assert f"`{f.sample_name}" in metrics
    diagnosis = (REPO / "docs" / "diagnosis.md").read_text()
    for a in Action:
        assert f"| `{a}` | `{VLLM.flag(a)}` |" in diagnosis
