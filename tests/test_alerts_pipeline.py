"""The alerting path end to end with the real programs, on loopback.

Pipeline: recorded real vLLM 0.32 snapshots (KV-bound run, tests/fixtures/vllm-0.32.0-cpu/kv_cache) served over HTTP
-> real ``kvwatch run`` -> real Prometheus (Debian ``prometheus``) loading the shipped rules -> real Alertmanager
(``prometheus-alertmanager``) loading the shipped alertmanager.yml and templates -> local HTTP receivers standing in
for Slack's incoming webhook, PagerDuty's Events API v2 and the heartbeat endpoint.

What the test copy changes, and nothing else:
- rules: time is compressed 60x (every range window ``[5m]`` -> ``[5s]``; 1 minute of rule time = 1 s), and ``for:``
  becomes 5 s for critical alerts and 15 s for warning / info ones - a warning then always fires after the critical
  of the same engine, so the test can see it inhibited from its first moment;
- alertmanager.yml: secrets files and receiver URLs point at the test's files and local receivers, the template
  path is absolute, group_wait / group_interval are 1 s / 2 s, the heartbeat repeats every 4 s;
- Prometheus scrapes and evaluates every second.

A second test pages for an SGLang target (``kvwatch sim --engine sglang``) through the same path: the delivered
notifications name SGLang's flag, not vLLM's.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.prometheus import Alertmanager, Kvwatch, Prometheus, WebhookReceiver
from tests.helpers.recordings import recording

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "alerts"
RULE_FILES = [ALERTS / "kvwatch-rules.yaml", ALERTS / "kvwatch-alerts.yaml"]
KV_RUN = REPO / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "kv_cache"
# While requests wait (Waiting 91 -> 4, KV 0.67-0.97, preemptions every second); and after the run (idle).
# It ends before 1796120565.16, where the queue has drained (0 waiting, 6 running): kvwatch rightly reads
# that sample `none`, and looped every 22 s it made a test's instant query fail by chance (CI, stop 22).
KV_BOUND = recording(KV_RUN, start=1796120543.0, end=1796120565.0)
IDLE = recording(KV_RUN, start=1796120567.0)

SLACK_KEY = "T000/B000/kvwatch-test"
ROUTING_KEY = "kvwatch-test-routing-key"
HEARTBEAT_TOKEN = "kvwatch-test-heartbeat-token"

_RANGE = re.compile(r"\[(\d+)([smhd])\]")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def compress_rules(path: Path, out_dir: Path) -> Path:
    """The test copy of a rule file: range windows / 60, ``for:`` 5 s (critical) or 15 s (others)."""
    doc = yaml.safe_load(path.read_text())

    def window(m: re.Match) -> str:
        return f"[{max(1, int(m.group(1)) * _UNIT[m.group(2)] // 60)}s]"

    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _RANGE.sub(window, str(rule["expr"]))
            if "for" in rule:
                rule["for"] = "5s" if rule.get("labels", {}).get("severity") == "critical" else "15s"
    out = out_dir / path.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def test_every_kv_bound_snapshot_has_requests_waiting():
    """The KV-bound replay loops: a drained sample in it is a `none` scrape every loop (see KV_BOUND)."""
    waiting = [re.search(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", p.read_text(), re.M) for _, p in KV_BOUND]
    assert len(waiting) >= 20 and all(m and float(m.group(1)) >= 4 for m in waiting), waiting


def test_compress_rules_changes_only_windows_and_for(tmp_path):
    for src in RULE_FILES:
        original = yaml.safe_load(src.read_text())
        compressed = yaml.safe_load(compress_rules(src, tmp_path).read_text())
        for g0, g1 in zip(original["groups"], compressed["groups"], strict=True):
            for r0, r1 in zip(g0["rules"], g1["rules"], strict=True):
                assert set(r0) == set(r1)
                assert {k: v for k, v in r0.items() if k not in ("expr", "for")} == {
                    k: v for k, v in r1.items() if k not in ("expr", "for")
                }
                assert _RANGE.sub("[W]", str(r0["expr"])) == _RANGE.sub("[W]", str(r1["expr"]))
    assert "[5s]" in (tmp_path / "kvwatch-alerts.yaml").read_text()


def alertmanager_test_config(
    tmp_path: Path, slack: WebhookReceiver, pagerduty: WebhookReceiver, heartbeat: WebhookReceiver
) -> dict:
    cfg = yaml.safe_load((ALERTS / "alertmanager.yml").read_text())
    cfg = copy.deepcopy(cfg)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "slack-webhook-url").write_text(f"{slack.url}/services/{SLACK_KEY}\n")
    (secrets / "pagerduty-routing-key").write_text(ROUTING_KEY + "\n")
    (secrets / "heartbeat-token").write_text(HEARTBEAT_TOKEN + "\n")
    cfg["global"]["slack_api_url_file"] = str(secrets / "slack-webhook-url")
    cfg["templates"] = [str(ALERTS / "templates" / "*.tmpl")]
    cfg["route"]["group_wait"] = "1s"
    cfg["route"]["group_interval"] = "2s"
    for route in cfg["route"]["routes"]:
        route.pop("group_wait", None)
        route.pop("group_interval", None)
        if route["receiver"] == "heartbeat":
            route["repeat_interval"] = "4s"
    for receiver in cfg["receivers"]:
        for pd in receiver.get("pagerduty_configs", []):
            assert pd["routing_key_file"].startswith("/etc/alertmanager/secrets/")
            pd["routing_key_file"] = str(secrets / "pagerduty-routing-key")
            pd["url"] = f"{pagerduty.url}/v2/enqueue"
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{heartbeat.url}/ping"
            hook["http_config"]["authorization"]["credentials_file"] = str(secrets / "heartbeat-token")
    return cfg


def slack_texts(rx: WebhookReceiver) -> list[tuple[float, str, str]]:
    """(time, title, text) of every Slack attachment received."""
    out = []
    for r in rx.snapshot():
        for att in (r.json or {}).get("attachments", []):
            out.append((r.at, att.get("title", ""), att.get("text", "")))
    return out


def pd_events(rx: WebhookReceiver) -> list[dict]:
    return [r.json for r in rx.snapshot() if r.json]


def test_kv_bound_target_pages_with_diagnosis_inhibits_warnings_and_resolves(tmp_path):
    t_start = time.monotonic()
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    rules = [compress_rules(p, rules_dir) for p in RULE_FILES]

    with (
        WebhookReceiver() as slack,
        WebhookReceiver(status=202) as pagerduty,
        WebhookReceiver() as heartbeat,
        Alertmanager(alertmanager_test_config(tmp_path, slack, pagerduty, heartbeat), tmp_path / "am") as am,
        FakeVllm().replay(KV_BOUND) as vllm,
        Kvwatch(["run", "--target", vllm.url, "--interval", "1"], tmp_path / "kvwatch") as kv,
    ):
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am.port}"]}]}]},
            "scrape_configs": [{"job_name": "kvwatch", "static_configs": [{"targets": [f"127.0.0.1:{kv.port}"]}]}],
        }
        with Prometheus(prom_cfg, tmp_path / "prom", rule_files=rules) as prom:
            groups = prom.rules()
            assert not [r for g in groups for r in g["rules"] if r.get("health") == "err"], groups

            # 1. The page: PagerDuty gets a trigger with the bottleneck and the fix, Slack the same.
            def preempting_trigger():
                return [
                    e
                    for e in pd_events(pagerduty)
                    if e.get("event_action") == "trigger"
                    and "KvwatchKVCachePreempting" in e["payload"]["custom_details"]["alerts"]
                ]

            events = pagerduty.wait_for(
                lambda _: preempting_trigger(), timeout=120, what="PagerDuty trigger for KvwatchKVCachePreempting"
            )
            ev = events[-1]
            assert ev["routing_key"] == ROUTING_KEY
            assert ev["payload"]["severity"] == "critical"
            assert "bottleneck kv_cache" in ev["payload"]["summary"]
            assert "fp8_kv_cache" in ev["payload"]["summary"]
            details = ev["payload"]["custom_details"]
            assert details["bottleneck"] == "kv_cache"
            assert details["recommendations"].split(", ")[0] == "fp8_kv_cache (--kv-cache-dtype fp8)"
            assert "preemptions/s" in details["evidence"] and "KV cache" in details["evidence"]
            assert "docs/alerts.md#kvwatch" in details["runbook"]
            assert ev["links"][0]["text"] == "Runbook"
            assert pagerduty.snapshot()[0].path == "/v2/enqueue"

            def critical_slack():
                return [
                    m for m in slack_texts(slack) if m[1].startswith("[FIRING") and "KvwatchKVCachePreempting" in m[2]
                ]

            _, title, text = slack.wait_for(lambda _: critical_slack(), timeout=60, what="Slack message for the page")[
                -1
            ]
            assert "tiny-llama-dummy engine 0" in title
            assert "*Bottleneck:* `kv_cache`" in text
            assert "*Recommended fixes (cheapest first):* fp8_kv_cache" in text
            assert "Top recommendation: fp8_kv_cache (--kv-cache-dtype fp8)." in text
            assert "preemptions/s" in text and "docs/alerts.md#kvwatchkvcachepreempting" in text
            assert slack.snapshot()[0].path == f"/services/{SLACK_KEY}"

            # 2. Inhibition: the 2m stall warning fires in Prometheus but Alertmanager holds it back.
            def warning_firing():
                return [
                    a
                    for a in prom.alerts()
                    if a["labels"]["alertname"] == "KvwatchKVCacheAdmissionStall"
                    and a["labels"]["severity"] == "warning"
                    and a["state"] == "firing"
                ]

            prom.wait_for(warning_firing, timeout=90, what="KvwatchKVCacheAdmissionStall warning firing in Prometheus")

            def warning_suppressed():
                got = am.alerts(filters=['alertname="KvwatchKVCacheAdmissionStall"', 'severity="warning"'])
                return (
                    got
                    and all(a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"] for a in got)
                    and got
                )

            suppressed = am.wait_for(warning_suppressed, timeout=30, what="the warning inhibited in Alertmanager")
            inhibitors = {fp for a in suppressed for fp in a["status"]["inhibitedBy"]}
            critical_fps = {a["fingerprint"] for a in am.alerts(filters=['severity="critical"'])}
            assert inhibitors <= critical_fps, (inhibitors, critical_fps)

            # Let a few group_intervals pass (2 s each) after the warning became active, then check that no Slack
            # message ever announced a firing warning.
            heartbeats = len(heartbeat.snapshot())
            heartbeat.wait_for(lambda reqs: len(reqs) >= heartbeats + 1, timeout=90, what="another Watchdog heartbeat")
            time.sleep(6)
            firing_warnings = [m for m in slack_texts(slack) if "(`warning`)" in m[2] and ":rotating_light:" in m[2]]
            assert not firing_warnings, firing_warnings

            # The Watchdog reaches the heartbeat receiver with the token from its file.
            hb = heartbeat.snapshot()[-1]
            assert hb.path == "/ping"
            assert hb.headers.get("Authorization") == f"Bearer {HEARTBEAT_TOKEN}"
            assert hb.json["commonLabels"]["alertname"] == "Watchdog"

            # 3. Recovery: the target goes idle; the page resolves in PagerDuty and Slack says so.
            vllm.replay(IDLE)
            t_recover = time.time()

            def pd_resolved():
                return [e for e in pd_events(pagerduty) if e.get("event_action") == "resolve"]

            resolved = pagerduty.wait_for(lambda _: pd_resolved(), timeout=180, what="PagerDuty resolve event")
            assert resolved[-1]["dedup_key"] == ev["dedup_key"]

            def slack_resolved():
                return [
                    m
                    for m in slack_texts(slack)
                    if m[0] >= t_recover and "resolved" in m[2] and "KvwatchKVCachePreempting" in m[2]
                ]

            slack.wait_for(lambda _: slack_resolved(), timeout=60, what="Slack resolve message for the page")
            assert prom.value('kvwatch_bottleneck{bottleneck="idle"}') == 1

    print(f"\npipeline test: {time.monotonic() - t_start:.0f} s")


def test_an_sglang_target_is_paged_in_sglangs_flags(tmp_path):
    """`kvwatch sim --engine sglang` (the max_num_seqs preset: Running pinned at 2, TTFT p99 ~20 s) watched by a real
    kvwatch: the TTFT SLO burn pages, and PagerDuty and Slack name the fix with SGLang's flag (--max-running-requests),
    never vLLM's (--max-num-seqs). Prometheus starts once kvwatch names max_num_seqs, so the page's first (and, within
    repeat_interval, only) notification carries it; the preset holds it from then on."""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    rules = [compress_rules(p, rules_dir) for p in RULE_FILES]
    sim_args = ["sim", "--scenario", "max_num_seqs", "--engine", "sglang", "--seed", "11"]
    with (
        WebhookReceiver() as slack,
        WebhookReceiver(status=202) as pagerduty,
        WebhookReceiver() as heartbeat,
        Alertmanager(alertmanager_test_config(tmp_path, slack, pagerduty, heartbeat), tmp_path / "am") as am,
        Kvwatch(sim_args, tmp_path / "sim", listen_flag="--port", ready_path="/metrics", name="sim") as sim,
        Kvwatch(["run", "--target", f"{sim.url}/metrics", "--interval", "1"], tmp_path / "kvwatch") as kv,
    ):

        def names_max_num_seqs() -> dict | None:
            d = json.loads(kv.get("/api/v1/diagnosis"))
            return d if d.get("engine_type") == "sglang" and d.get("bottleneck") == "max_num_seqs" else None

        diagnosis = kv.wait_for(names_max_num_seqs, timeout=60, what="kvwatch names max_num_seqs on the SGLang sim")
        (engine,) = diagnosis["engines"]
        assert engine["recommendations"][0]["flag"] == "--max-running-requests"
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am.port}"]}]}]},
            "scrape_configs": [{"job_name": "kvwatch", "static_configs": [{"targets": [f"127.0.0.1:{kv.port}"]}]}],
        }
        with Prometheus(prom_cfg, tmp_path / "prom", rule_files=rules):

            def ttft_page():
                return [
                    e
                    for e in pd_events(pagerduty)
                    if e.get("event_action") == "trigger"
                    and "KvwatchTTFTBudgetBurn" in e["payload"]["custom_details"]["alerts"]
                ]

            ev = pagerduty.wait_for(lambda _: ttft_page(), timeout=120, what="PagerDuty trigger for the SGLang target")[
                -1
            ]
            fixes = "raise_max_num_seqs (--max-running-requests), add_replica (replicas (or --dp-size))"
            assert f"fix first: {fixes}" in ev["payload"]["summary"]
            details = ev["payload"]["custom_details"]
            assert details["recommendations"] == fixes
            assert "Top recommendation: raise_max_num_seqs (--max-running-requests)." in details["alerts"]

            def slack_page():
                return [m for m in slack_texts(slack) if m[1].startswith("[FIRING") and "KvwatchTTFTBudgetBurn" in m[2]]

            _, _, text = slack.wait_for(lambda _: slack_page(), timeout=60, what="Slack message for the SGLang page")[
                -1
            ]
            assert f"*Recommended fixes (cheapest first):* {fixes}" in text
            assert "Top recommendation: raise_max_num_seqs (--max-running-requests)." in text
            assert "--max-num-seqs" not in text + json.dumps(ev)  # vLLM's spelling reaches no one paged for SGLang
