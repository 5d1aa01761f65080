"""deploy/components/autoscaling/, rendered with the real ``kubectl kustomize`` and checked offline.

- deploy/overlays/autoscaling renders a complete KEDA ScaledObject that validates against KEDA v2.20.2's CRD
  (tests/fixtures/schemas/keda.sh_scaledobjects.yaml, unknown fields rejected), passes the checks KEDA's
  admission webhook makes (fallback needs an AverageValue trigger; min <= max), uses only the Prometheus
  scaler's metadata keys, targets the Deployment it renders beside, and queries a recording rule that
  alerts/kvwatch-rules.yaml defines, for the namespace and served model name the example deploys;
- the HPA variant (tests/fixtures/deploy/autoscaling-hpa; its built-in kinds are validated strictly by
  tests/test_deploy.py with kubernetes-validate) asks prometheus-adapter for an External metric that the
  shipped adapter rule serves from the same recording rule, by the labels the rule keeps.
"""

from __future__ import annotations

import re

import jsonschema
import pytest
import yaml

from tests.test_deploy import DEPLOY, EXAMPLE, REPO, WITH_HPA, render, validate_custom

KEDA = DEPLOY / "overlays" / "autoscaling"
RULES = yaml.safe_load((REPO / "alerts" / "kvwatch-rules.yaml").read_text())
RECORDED = {r["record"]: r for g in RULES["groups"] for r in g["rules"] if "record" in r}
DESIRED = "namespace_model:kvwatch_desired_replicas:ceil"
# The Prometheus scaler's trigger metadata (KEDA v2.20.2 pkg/scalers/prometheus_scaler.go, prometheusMetadata's
# `keda:"name=..."` tags); KEDA ignores unknown keys, so a misspelt one would silently not apply.
PROMETHEUS_SCALER_KEYS = {
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
    "awsRegion",
    "timeout",
    "identityOwner",
}


def _one(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _example_model() -> tuple[str, str]:
    deploy = _one(render(EXAMPLE), "Deployment")
    (vllm,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    (served,) = [a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--served-model-name=")]
    return deploy["metadata"]["namespace"], served


def _keda_webhook_problems(so: dict) -> list[str]:
    """What KEDA's admission webhook refuses (apis/keda/v1alpha1/scaledobject_types.go CheckFallbackValid and
    CheckReplicaCountBoundsAreValid, v2.20.2)."""
    spec, problems = so["spec"], []
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        problems.append("minReplicaCount > maxReplicaCount")
    if "fallback" in spec and not any(
        t["type"] not in ("cpu", "memory") and t.get("metricType", "AverageValue") == "AverageValue"
        for t in spec["triggers"]
    ):
        problems.append("fallback without an AverageValue trigger")
    return problems


def test_the_autoscaling_overlay_renders_a_complete_scaledobject():
    docs = render(KEDA)
    so = _one(docs, "ScaledObject")
    validate_custom(so)
    assert _keda_webhook_problems(so) == []
    spec = so["spec"]
    deploy = _one(docs, "Deployment")
    assert spec["scaleTargetRef"]["name"] == deploy["metadata"]["name"]
    assert so["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["fallback"]["replicas"] >= spec["minReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert set(meta) <= PROMETHEUS_SCALER_KEYS, set(meta) - PROMETHEUS_SCALER_KEYS
    assert meta["threshold"] == "1"  # AverageValue 1: the HPA's desired replicas are the rule's value
    assert meta["ignoreNullValues"] == "false"  # an absent rule is a failure (fallback), not 0 replicas
    namespace, model = _example_model()
    assert meta["query"] == f'max({DESIRED}{{namespace="{namespace}",model_name="{model}"}})'
    assert DESIRED in RECORDED


def test_the_keda_crd_and_webhook_checks_refuse_a_broken_scaledobject():
    so = _one(render(KEDA), "ScaledObject")
    validate_custom(so)
    bad = yaml.safe_load(yaml.safe_dump(so))
    bad["spec"]["minReplicas"] = 1  # HPA's spelling, not KEDA's
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate_custom(bad)
    bad = yaml.safe_load(yaml.safe_dump(so))
    del bad["spec"]["fallback"]["replicas"]
    with pytest.raises(jsonschema.ValidationError, match="replicas"):
        validate_custom(bad)
    bad = yaml.safe_load(yaml.safe_dump(so))
    bad["spec"]["triggers"][0]["metricType"] = "Value"
    assert _keda_webhook_problems(bad) == ["fallback without an AverageValue trigger"]


def test_the_hpa_reads_the_external_metric_the_adapter_rule_serves():
    docs = render(WITH_HPA)
    hpa, deploy = _one(docs, "HorizontalPodAutoscaler"), _one(docs, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deploy["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External" and metric["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": "1",
    }
    cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "prometheus-adapter-kvwatch"]
    (rule,) = yaml.safe_load(cm[0]["data"]["config.yaml"])["externalRules"]
    assert set(rule) == {"seriesQuery", "resources", "name", "metricsQuery"}
    assert rule["seriesQuery"].split("{")[0] == DESIRED and DESIRED in RECORDED
    assert re.fullmatch(rule["name"]["matches"], DESIRED)
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    # the HPA selects by labels the adapter query keeps, and the recording rule keeps them too
    kept = set(re.search(r"by \(([^)]*)\)", rule["metricsQuery"]).group(1).replace(" ", "").split(","))
    selector = set(metric["external"]["metric"]["selector"]["matchLabels"])
    assert selector <= kept
    aggregated = re.search(r"by \(([^)]*)\)", RECORDED["namespace_model:kvwatch_demand_sequences:sum"]["expr"])
    assert kept <= set(aggregated.group(1).replace(" ", "").split(","))
    _, model = _example_model()
    assert metric["external"]["metric"]["selector"]["matchLabels"]["model_name"] == model
    assert not [d for d in docs if d["kind"] == "ScaledObject"], "KEDA and an HPA must not scale one Deployment"
