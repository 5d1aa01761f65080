"""alerts/ checked with the real tools (promtool, amtool) and against the contract in docs/ (metrics, diagnosis, alerts).

promtool / amtool missing is a failure, not a skip: CI installs them with .ci/install-tools.sh.
The end-to-end path (real Prometheus + Alertmanager + kvwatch) is tests/test_alerts_pipeline.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from kvwatch.catalog import Action, Bottleneck
from tests.helpers.prometheus import BinaryMissing, find_binary

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "alerts"
RULE_FILES = [ALERTS / "kvwatch-rules.yaml", ALERTS / "kvwatch-alerts.yaml"]
AM_CONFIG = ALERTS / "alertmanager.yml"
DOCS = REPO / "docs"
RUNBOOKS = DOCS / "alerts.md"
SCHEMA = REPO / "tests" / "fixtures" / "schemas" / "monitoring.coreos.com_prometheusrules.yaml"

BOTTLENECKS = set(Bottleneck)
ACTIONS = [str(a) for a in Action]
REQUIRED_ALERTS = {
    "KvwatchKVCacheAdmissionStall",
    "KvwatchKVCachePreempting",
    "KvwatchThroughputGapSustained",
    "KvwatchMaxNumSeqsBinding",
    "KvwatchTokenBudgetBinding",
    "KvwatchEngineStalled",
    "KvwatchKVCacheSaturationForecast",
    "KvwatchVLLMUnreachable",
    "KvwatchDown",
    "KvwatchAbsent",
    "KvwatchTTFTBudgetBurn",
    "KvwatchScaleOutNotNeeded",
    "KvwatchMaxLorasBinding",
    "KvwatchEngineAsleep",
    "KvwatchRequestsRejected",
    "KvwatchKVTransferBinding",
    "Watchdog",
}


def tool(name: str) -> str:
    try:
        return find_binary(name)
    except BinaryMissing as exc:
        pytest.fail(str(exc))


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((ALERTS / "kvwatch-alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def recording_rules() -> list[dict]:
    doc = yaml.safe_load((ALERTS / "kvwatch-rules.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "record" in r]


# -- promtool ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_promtool_check_rules():
    proc = run(tool("promtool"), "check", "rules", *map(str, RULE_FILES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 20 rules found" in proc.stdout, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("test_file", ["kvwatch-alerts.test.yaml", "kvwatch-rules.test.yaml"])
def test_promtool_unit_tests(test_file):
    proc = run(tool("promtool"), "test", "rules", test_file, cwd=ALERTS / "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_unit_tested_firing_and_not_firing():
    tests = yaml.safe_load((ALERTS / "tests" / "kvwatch-alerts.test.yaml").read_text())["tests"]
    firing, quiet = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
            for exp in case["exp_alerts"]:
                severity = exp["exp_labels"]["severity"]
                firing.add((case["alertname"], severity))
    names = {r["alert"] for r in alert_rules()}
    tiers = {(r["alert"], r["labels"]["severity"]) for r in alert_rules()}
    assert names - firing == set(), "never tested firing"
    assert tiers - firing == set(), "a severity tier never tested firing"
    assert (names - {"Watchdog"}) - quiet == set(), "never tested not firing"


def test_unit_test_inputs_are_real_kvwatch_series():
    """Every kvwatch_* series in the promtool inputs is a metric kvwatch really exports (captured output)."""
    captured = set()
    for f in (ALERTS / "tests" / "kvwatch-output").glob("*.prom"):
        captured |= {
            line.split("{")[0].split(" ")[0] for line in f.read_text().splitlines() if line.startswith("kvwatch_")
        }
    tests = yaml.safe_load((ALERTS / "tests" / "kvwatch-alerts.test.yaml").read_text())["tests"]
    used = {s["series"].split("{")[0] for t in tests for s in t["input_series"] if s["series"].startswith("kvwatch_")}
    assert used and used <= captured, used - captured


# -- the rules against the contract --------------------------------------------------------------------------


def test_alerts_follow_the_mixin_conventions():
    for rule in alert_rules():
        name = rule["alert"]
        assert name == "Watchdog" or re.fullmatch(r"Kvwatch[A-Z][A-Za-z0-9]+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        ann = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(ann), name
        assert "{{" not in ann["summary"], f"{name}: summary must be static"
        if name != "Watchdog":
            assert "for" in rule, f"{name} has no for:"
    assert REQUIRED_ALERTS <= {r["alert"] for r in alert_rules()}
    severities = {(r["alert"], r["labels"]["severity"]) for r in alert_rules()}
    assert ("KvwatchKVCachePreempting", "critical") in severities
    assert ("KvwatchEngineStalled", "critical") in severities


def test_engine_alerts_carry_the_diagnosis():
    """Engine-level alerts name the bottleneck and the top recommendation in description, from kvwatch's series."""
    for rule in alert_rules():
        ann = rule["annotations"]
        if "$labels.engine" not in ann["description"]:
            continue
        assert "Bottleneck:" in ann["description"] and "Top recommendation:" in ann["description"], rule["alert"]
        assert "kvwatch_recommendation" in ann["recommendations"]
        assert "kvwatch_bottleneck" in ann["bottleneck"]


def test_rules_only_use_exported_metrics():
    documented = (DOCS / "metrics.md").read_text()
    exported = {m.removesuffix("_total") for m in re.findall(r"`(kvwatch_[a-z_]+)", documented)}
    used = set()
    for f in RULE_FILES:  # kvwatch's own series, not recording rules named level:kvwatch_...:op
        used |= set(re.findall(r"(?<![:\w])(kvwatch_[a-z_]+)", f.read_text()))
    used = {m.removesuffix("_total") for m in used}
    assert used <= exported, used - exported
    # bottleneck / action label values are the catalogue's vocabulary
    text = "".join(f.read_text() for f in RULE_FILES)
    assert set(re.findall(r'bottleneck="([a-z_]+)"', text)) <= BOTTLENECKS
    assert set(re.findall(r'"action", "([a-z0-9_]+)"', text)) == set(ACTIONS)


def test_recommendation_cost_order_matches_the_docs():
    documented = (DOCS / "diagnosis.md").read_text()
    section = documented.split("<!-- BEGIN catalog:actions -->", 1)[1].split("<!-- END", 1)[0]
    assert re.findall(r"^\| `([a-z_0-9]+)`", section, re.M) == ACTIONS
    rank = next(r for r in recording_rules() if r["record"] == "kvwatch:recommendation_action:cost_rank")
    assert re.findall(r'vector\((\d+)\), "action", "([a-z0-9_]+)"', rank["expr"]) == [
        (str(i + 1), a) for i, a in enumerate(ACTIONS)
    ]


def test_recording_rules_are_named_level_metric_operations():
    for rule in recording_rules():
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]
    raw = "".join(str(r["expr"]) for r in recording_rules())
    for metric in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_by_source_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:cache_config_info",
        "vllm:request_prompt_tokens_sum",
        "vllm:request_generation_tokens_count",
        "vllm:iteration_tokens_total_sum",
    ):
        assert metric in raw, metric


def test_recording_rules_use_real_vllm_names():
    """Every vllm:* name in the rules appears in the real vLLM 0.32 capture (or is a documented fallback)."""
    capture = (REPO / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "kv_cache" / "1796120550.719.prom").read_text()
    names = set(re.findall(r"^(vllm:[a-z_:]+)", capture, re.M))
    used = set(re.findall(r"(vllm:[a-z_]+)", "".join(str(r["expr"]) for r in recording_rules())))
    assert used <= names, used - names


ENGINE_NAME = re.compile(r"\b((?:sglang:|llamacpp:|trtllm_|nv_trt_llm_)[a-z_]+)")
SAMPLE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def test_fleet_rules_read_the_families_the_adapters_read():
    """Every other engine's name in the fleet rules is a family its adapter keeps (kvwatch/engines/*.py) or one its
    FAMILIES.md documents from the engine's source (Triton's iteration counter), and each engine has its rules."""
    from kvwatch.engines import llamacpp, sglang, trtllm

    families = REPO / "tests" / "fixtures" / "engines"
    known = set().union(sglang.KEEP_FAMILIES, trtllm.KEEP_FAMILIES, llamacpp.KEEP_FAMILIES)
    documented = "".join((families / e / "FAMILIES.md").read_text() for e in ("sglang", "trtllm", "llamacpp"))
    fleet = [
        r
        for g in yaml.safe_load((ALERTS / "kvwatch-rules.yaml").read_text())["groups"]
        if g["name"].startswith("vllm.fleet")
        for r in g["rules"]
    ]
    used = set(ENGINE_NAME.findall("".join(str(r["expr"]) for r in fleet)))
    for name in used:
        family = next((name.removesuffix(s) for s in SAMPLE_SUFFIXES if name.endswith(s)), name)
        bare = family.removeprefix("sglang:").removeprefix("llamacpp:")
        assert family in known or f"`{family}`" in documented or f"`{bare}`" in documented, name
    for prefix in ("sglang:", "llamacpp:", "trtllm_", "nv_trt_llm_"):
        assert any(n.startswith(prefix) for n in used), prefix


# -- runbooks --------------------------------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_runbook_url_has_its_section():
    text = RUNBOOKS.read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#{2,3} (.+)$", text, re.M)}
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("https://") and "/docs/alerts.md#" in url, url
        assert url.split("#", 1)[1] in anchors, f"{rule['alert']}: no section for {url}"
    for name in {r["alert"] for r in alert_rules()}:
        assert f"## {name}" in text


def test_runbooks_order_fixes_by_cost_with_trade_offs():
    text = RUNBOOKS.read_text()
    fixes = text.split("## Fixes, cheapest first", 1)[1]
    positions = [fixes.find(f"### {a}\n") for a in ACTIONS]
    assert all(p >= 0 for p in positions), dict(zip(ACTIONS, positions, strict=False))
    assert positions == sorted(positions), "fixes must be listed in cost order"
    assert fixes.lower().count("trade-off") >= len(ACTIONS)


def test_runbooks_name_no_vllm_flag_without_the_other_engines_spelling():
    """A runbook section that names vLLM's flag of an action gives every engine's spelling of it (the generated
    flags table), or says the flag is vLLM's; every fix opens with its generated table (alerts/generate.py --check)."""
    import alerts.generate as gen

    text = RUNBOOKS.read_text()
    assert gen.runbook_flag_problems(text) == []
    stalled = "**Fix.** [`restart_engine`](#restart_engine): delete the pod"
    assert text.count(stalled) == 1
    bare = text.replace(stalled, "**Fix.** Lower `--max-num-seqs`, or " + stalled[len("**Fix.** ") :])
    assert gen.runbook_flag_problems(bare) == [
        "docs/alerts.md, '## KvwatchEngineStalled': vLLM's --max-num-seqs without SGLang, TensorRT-LLM, llama.cpp's "
        "spelling of raise_max_num_seqs in the section (label it vLLM's, or add the table "
        "catalog:flags_raise_max_num_seqs)"
    ]
    labelled = text.replace(stalled, "**Fix.** Lower vLLM's `--max-num-seqs`, or " + stalled[len("**Fix.** ") :])
    assert gen.runbook_flag_problems(labelled) == []
    # beside the generated table (KvwatchMaxNumSeqsBinding carries raise_max_num_seqs'), the bare flag is fine
    ceiling = "An inferred ceiling: find the engine's flag"
    assert text.count(ceiling) == 1
    assert gen.runbook_flag_problems(text.replace(ceiling, ceiling + " (`--max-num-seqs` for vLLM)")) == []
    table = re.search(
        r"(### raise_max_num_seqs\n\n)(<!-- BEGIN catalog:flags_raise_max_num_seqs -->.*?<!-- END.*?-->\n)", text, re.S
    )
    assert gen.runbook_flag_problems(text.replace(table.group(0), table.group(1))) == [
        "docs/alerts.md: the fix '### raise_max_num_seqs' does not open with its table catalog:flags_raise_max_num_seqs"
    ]
    assert "docs/alerts.md" not in " ".join(gen.vocabulary_problems())


def test_each_fix_opens_with_every_engines_flag_of_it():
    """The generated tables in docs/alerts.md are the Engine registry's FLAGS (docs/generate.py --check refuses drift)."""
    from kvwatch.engines import ENGINES

    text = RUNBOOKS.read_text()
    for action in Action:
        fix = text.split(f"\n### {action}\n", 1)[1]
        block = fix.split(f"<!-- BEGIN catalog:flags_{action} -->\n", 1)[1].split("<!-- END", 1)[0]
        header, _, row = block.strip().splitlines()
        assert header == "| " + " | ".join(e.title for e in ENGINES) + " |"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells == [f"`{e.flag(action)}`" if e.flag(action) != "-" else "none" for e in ENGINES], action
    assert "| `--max-num-seqs` | `--max-running-requests` | `--max_batch_size` | `--parallel` |" in text


# -- Alertmanager ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_amtool_check_config():
    proc = run(tool("amtool"), "check-config", str(AM_CONFIG))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout and "1 templates" in proc.stdout, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=KvwatchKVCachePreempting", "severity=critical"], "pagerduty-and-slack"),
        (["alertname=KvwatchEngineStalled", "severity=critical"], "pagerduty-and-slack"),
        (["alertname=KvwatchKVCacheAdmissionStall", "severity=warning"], "slack"),
        (["alertname=KvwatchScrapeErrors", "severity=info"], "blackhole"),
        (["alertname=Watchdog", "severity=info"], "heartbeat"),
        (["alertname=SomethingElse"], "slack"),
    ],
)
def test_amtool_routes(labels, receiver):
    proc = run(
        tool("amtool"),
        "config",
        "routes",
        "test",
        f"--config.file={AM_CONFIG}",
        "namespace=llm",
        "pod=vllm-0",
        "model_name=m",
        *labels,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == receiver, (labels, proc.stdout)


def test_alertmanager_secrets_come_only_from_files():
    cfg = yaml.safe_load(AM_CONFIG.read_text())
    assert cfg["global"]["slack_api_url_file"].startswith("/etc/alertmanager/secrets/")
    assert "slack_api_url" not in cfg["global"]
    for rcv in cfg["receivers"]:
        for pd in rcv.get("pagerduty_configs", []):
            assert "routing_key" not in pd and "service_key" not in pd and pd["routing_key_file"]
            assert pd["send_resolved"] is True
        for sl in rcv.get("slack_configs", []):
            assert "api_url" not in sl and sl["send_resolved"] is True
        for hook in rcv.get("webhook_configs", []):
            assert hook["http_config"]["authorization"]["credentials_file"]
    assert cfg["route"]["group_by"] == ["cluster", "namespace", "pod", "model_name"]


_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"?(.*?)"?$')


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    key, op, value = _MATCHER.match(matcher).groups()
    have = labels.get(key, "")
    return {
        "=": have == value,
        "!=": have != value,
        "=~": bool(re.fullmatch(value, have)),
        "!~": not re.fullmatch(value, have),
    }[op]


def test_inhibitions_never_silence_the_watchdog_and_name_real_alerts():
    cfg = yaml.safe_load(AM_CONFIG.read_text())
    names = {r["alert"] for r in alert_rules()}
    watchdog = {"alertname": "Watchdog", "severity": "info"}
    for rule in cfg["inhibit_rules"]:
        for m in rule["source_matchers"] + rule["target_matchers"]:
            key, op, value = _MATCHER.match(m).groups()
            if key == "alertname" and op == "=":
                assert value in names, value
            if key == "alertname" and op == "=~":
                assert any(re.fullmatch(value, n) for n in names), value
        assert not all(_matches(m, watchdog) for m in rule["target_matchers"]), f"{rule} could silence the Watchdog"
    # and the intended ones do inhibit
    stall_warning = {"alertname": "KvwatchKVCacheAdmissionStall", "severity": "warning"}
    preempting = {"alertname": "KvwatchKVCachePreempting", "severity": "critical"}
    assert any(
        all(_matches(m, preempting) for m in r["source_matchers"])
        and all(_matches(m, stall_warning) for m in r["target_matchers"])
        for r in cfg["inhibit_rules"]
    )
    down = {"alertname": "KvwatchDown", "severity": "warning"}
    assert any(
        all(_matches(m, down) for m in r["source_matchers"])
        and all(_matches(m, preempting) for m in r["target_matchers"])
        for r in cfg["inhibit_rules"]
    )


# -- the generated PrometheusRule -----------------------------------------------------------------------------


def test_prometheusrule_is_generated_from_the_rule_files():
    proc = run(sys.executable, str(ALERTS / "generate.py"), "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    generated = yaml.safe_load((ALERTS / "prometheusrule.yaml").read_text())
    source_groups = []
    for f in RULE_FILES:
        source_groups += yaml.safe_load(f.read_text())["groups"]
    assert generated["spec"]["groups"] == source_groups


def test_generate_check_detects_drift(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("alerts_generate", ALERTS / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(gen.render().replace("for: 5m", "for: 6m", 1))
    monkeypatch.setattr(gen, "OUTPUT", stale)
    assert gen.main(["--check"]) == 1
    gen.main([])
    assert gen.main(["--check"]) == 0


def test_the_flag_group_is_every_engines_flag_of_every_action():
    """kvwatch.flags (generated) holds one series per (engine, action) with the engine's own spelling, from the Engine
    registry: the words kvwatch's own advice uses (Engine.flag); none where an engine has no flag ("-")."""
    from kvwatch.engines import ENGINES

    (group,) = [
        g for g in yaml.safe_load((ALERTS / "kvwatch-rules.yaml").read_text())["groups"] if g["name"] == "kvwatch.flags"
    ]
    got = [(r["labels"]["engine_type"], r["labels"]["action"], r["labels"]["flag"]) for r in group["rules"]]
    assert {r["record"] for r in group["rules"]} == {"kvwatch:recommendation_action_flag:info"}
    assert {str(r["expr"]) for r in group["rules"]} == {"vector(1)"}
    want = [(e.name, str(a), e.flag(a)) for e in ENGINES for a in Action if e.flag(a) != "-"]
    assert got == want
    assert ("sglang", "raise_max_num_seqs", "--max-running-requests") in got
    assert ("llamacpp", "scale_prefill_side") not in {(e, a) for e, a, _ in got}


def test_check_refuses_a_flag_group_that_drifts_and_generating_restores_it(tmp_path, monkeypatch):
    import alerts.generate as gen

    rules = (ALERTS / "kvwatch-rules.yaml").read_text()
    assert gen.flags_problems(rules) == [] and gen.with_flags(rules) == rules
    spelled = 'engine_type: sglang, action: raise_max_num_seqs, flag: "--max-running-requests"'
    assert spelled in rules
    drifted = rules.replace(spelled, 'engine_type: sglang, action: raise_max_num_seqs, flag: "--max-num-seqs"')
    assert gen.flags_problems(drifted) == [
        "kvwatch-rules.yaml's kvwatch.flags group differs from kvwatch/engines' FLAGS: run python alerts/generate.py"
    ]
    assert gen.with_flags(drifted) == rules
    unmarked = rules.replace("# BEGIN generated:kvwatch.flags", "# kvwatch.flags")
    assert gen.flags_problems(unmarked) == ["kvwatch-rules.yaml has no generated kvwatch.flags group"]
    for f in gen.SOURCES:
        (tmp_path / f).write_text((ALERTS / f).read_text())
    (tmp_path / "kvwatch-rules.yaml").write_text(drifted)
    monkeypatch.setattr(gen, "HERE", tmp_path)
    assert gen.vocabulary_problems() == [
        "kvwatch-rules.yaml's kvwatch.flags group differs from kvwatch/engines' FLAGS: run python alerts/generate.py"
    ]


def test_check_refuses_alert_text_that_spells_a_flag_instead_of_joining_the_flag_group(tmp_path, monkeypatch):
    """A page names each flag in the paged engine's words, so no annotation may spell one engine's flag (or build one
    from a label), and the top recommendation and the recommendations list must join kvwatch.flags."""
    import alerts.generate as gen

    assert gen.annotation_flag_problems() == []
    alerts = (ALERTS / "kvwatch-alerts.yaml").read_text()
    join = (
        '{{ $action := . | first | label "action" }}{{ $action }}{{ with printf `kvwatch:recommendation_action_flag:info'
        "{action=%q} and on (engine_type) kvwatch_target_info{job=%q,instance=%q,target=%q}` $action $labels.job "
        '$labels.instance $labels.target | query }} ({{ . | first | label "flag" }}){{ end }}'
    )
    assert alerts.count(join) == 12
    token_budget = alerts.index("- alert: KvwatchTokenBudgetBinding")
    unjoined = alerts[:token_budget] + alerts[token_budget:].replace(join, '{{ . | first | label "action" }}', 1)
    by_hand = alerts.replace("every LoRA slot has been taken", "every LoRA slot (--max-loras) has been taken")
    from_label = alerts.replace("raising it adds", 'raising --{{ $labels.limit | reReplaceAll "_" "-" }} adds')
    for text, problem in (
        (unjoined, "KvwatchTokenBudgetBinding: its top recommendation does not name the flag from "),
        (by_hand, "KvwatchMaxLorasBinding: description spells the flag --max-loras by hand"),
        (from_label, "KvwatchScaleOutNotNeeded: description builds a flag from a label"),
    ):
        assert text != alerts
        for f in gen.SOURCES:
            (tmp_path / f).write_text((ALERTS / f).read_text())
        (tmp_path / "kvwatch-alerts.yaml").write_text(text)
        monkeypatch.setattr(gen, "HERE", tmp_path)
        (found,) = gen.annotation_flag_problems()
        assert found.startswith(problem), found
        assert found in gen.vocabulary_problems()


def test_prometheusrule_validates_against_the_crd():
    crd = yaml.safe_load(SCHEMA.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = version["schema"]["openAPIV3Schema"]
    doc = yaml.safe_load((ALERTS / "prometheusrule.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(doc)
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"


def test_check_refuses_rules_that_disagree_with_the_catalogue(tmp_path, monkeypatch):
    import alerts.generate as gen

    assert gen.vocabulary_problems() == []
    rules = (ALERTS / "kvwatch-rules.yaml").read_text()
    alerts = (ALERTS / "kvwatch-alerts.yaml").read_text()
    for name, text in {
        "kvwatch-rules.yaml": rules.replace('"action", "add_replica"', '"action", "add_replicas"'),
        "kvwatch-alerts.yaml": alerts.replace('kvwatch_bottleneck{bottleneck="token_budget"}', "vector(0)"),
    }.items():
        for f in gen.SOURCES:
            (tmp_path / f).write_text((ALERTS / f).read_text())
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(gen, "HERE", tmp_path)
        assert gen.vocabulary_problems(), name


def test_check_refuses_a_runbook_url_off_the_docs_page(tmp_path, monkeypatch):
    """Each runbook_url is alerts/generate.py's RUNBOOK_URL + the alert's section of docs/alerts.md; generating
    puts a stray one (here: the runbooks' old place) back."""
    import alerts.generate as gen

    alerts = (ALERTS / "kvwatch-alerts.yaml").read_text()
    stray = alerts.replace(f"{gen.RUNBOOK_URL}#kvwatchdown", "https://example.com/alerts/runbooks.md#kvwatchdown")
    assert stray != alerts
    for f in gen.SOURCES:
        (tmp_path / f).write_text((ALERTS / f).read_text())
    (tmp_path / "kvwatch-alerts.yaml").write_text(stray)
    monkeypatch.setattr(gen, "HERE", tmp_path)
    assert [p for p in gen.vocabulary_problems() if "runbook" in p] == [
        f"KvwatchDown: runbook_url 'https://example.com/alerts/runbooks.md#kvwatchdown' is not {gen.RUNBOOK_URL}#kvwatchdown"
    ]
    assert gen.with_runbook_urls(stray) == alerts
    monkeypatch.setattr(gen, "RUNBOOKS", tmp_path / "alerts.md")
    (tmp_path / "alerts.md").write_text(RUNBOOKS.read_text().replace("## KvwatchDown\n", "## Kvwatch down\n"))
    (tmp_path / "kvwatch-alerts.yaml").write_text(alerts)
    assert gen.runbook_problems(gen.RUNBOOKS.read_text()) == ["docs/alerts.md has no section '## KvwatchDown'"]


def test_check_refuses_a_page_on_the_diagnosis_without_the_confidence_gate(tmp_path, monkeypatch):
    """Every critical alert that reads kvwatch's diagnosis requires confidence high or medium (issue 14); the SLO
    burn, which reads none, is not held to it."""
    import alerts.generate as gen

    assert gen.page_problems() == []
    assert gen.CONFIDENCE_GATE == 'kvwatch_diagnosis_confidence{confidence=~"high|medium"} == 1'
    pages = [r for r in alert_rules() if r["labels"]["severity"] == "critical"]
    gated = {r["alert"] for r in pages if gen.CONFIDENCE_GATE in " ".join(r["expr"].split())}
    assert gated == {"KvwatchKVCacheAdmissionStall", "KvwatchKVCachePreempting", "KvwatchEngineStalled"}
    assert {r["alert"] for r in pages} - gated == {"KvwatchTTFTBudgetBurn"}
    alerts = (ALERTS / "kvwatch-alerts.yaml").read_text()
    ungated = alerts.replace(
        'kvwatch_bottleneck{bottleneck="stalled"} == 1\n'
        "          and on (job, instance, target, model_name, engine)\n"
        '          kvwatch_diagnosis_confidence{confidence=~"high|medium"} == 1',
        'kvwatch_bottleneck{bottleneck="stalled"} == 1',
    )
    assert ungated != alerts
    for f in gen.SOURCES:
        (tmp_path / f).write_text((ALERTS / f).read_text())
    (tmp_path / "kvwatch-alerts.yaml").write_text(ungated)
    monkeypatch.setattr(gen, "HERE", tmp_path)
    assert gen.page_problems() == [
        f"KvwatchEngineStalled pages on kvwatch's diagnosis without requiring {gen.CONFIDENCE_GATE}"
    ]


def test_check_refuses_a_page_on_undetermined(tmp_path, monkeypatch):
    """undetermined names no limit (requests wait, too little history): it has no alert of its own, and a critical
    alert that selects it, gated or not, is refused (issue 25). Its confidence is always low, so the gate alone would
    drop it too: tests/test_diagnose.py checks that."""
    import alerts.generate as gen

    alerts = (ALERTS / "kvwatch-alerts.yaml").read_text()
    paging = alerts.replace(
        'kvwatch_bottleneck{bottleneck="stalled"} == 1', 'kvwatch_bottleneck{bottleneck=~"stalled|undetermined"} == 1'
    )
    assert paging != alerts and "undetermined" not in alerts
    for f in gen.SOURCES:
        (tmp_path / f).write_text((ALERTS / f).read_text())
    (tmp_path / "kvwatch-alerts.yaml").write_text(paging)
    monkeypatch.setattr(gen, "HERE", tmp_path)
    assert gen.page_problems() == ["KvwatchEngineStalled pages on bottleneck undetermined"]
    monkeypatch.setattr(gen, "HERE", ALERTS)
    assert gen.vocabulary_problems() == []  # no alert of its own is required either
