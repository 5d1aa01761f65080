"""The Kubernetes manifests in deploy/, rendered with the real ``kubectl kustomize`` and checked offline.

- every overlay (and the two bases that stand alone) renders with plain ``kubectl kustomize DIR`` (no
  ``--load-restrictor``), and deploy/monitoring/ renders alerts/ and grafana/ output by reference, not a copy;
- every built-in object validates with ``kubernetes-validate --strict`` against Kubernetes 1.29 and the newest
  schema it ships; every PodMonitor / PrometheusRule against the Prometheus Operator CRD's openAPIV3Schema
  (tests/fixtures/schemas), with unknown fields rejected;
- the sidecar is a native sidecar with the restricted Pod Security profile, requests = limits (Guaranteed QoS),
  probes on /healthz and /readyz, and its port, paths, env names and image tag are kvwatch's own
  (kvwatch.config.Settings, pyproject.toml, the Dockerfile's USER); the real kvwatch, started with the env the
  manifest gives it, serves those probe paths while vLLM is unreachable;
- kvwatch reads the scheduler limits from the very ConfigMap keys vLLM's flags come from;
- the NetworkPolicy admits only Prometheus to kvwatch's port; the PodMonitors select the pods that carry it;
- the optional web-config component (rendered on top of the example, tests/fixtures/deploy/web-config) mounts
  the web config and the certificate from Secrets where the config says, switches the probes to HTTPS and the
  PodMonitor to HTTPS with basic auth; the real kvwatch, given that env and those files, serves the probes
  without credentials over TLS and /metrics only with them, and refuses the shipped placeholder hash;
- the Alertmanager Secret template passes ``amtool check-config``, routes by severity, and a real Alertmanager
  reads the receivers' keys from the mounted files.
"""

from __future__ import annotations

import base64
import copy
import functools
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import bcrypt
import httpx
import jsonschema
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tests.helpers.certs import Ca
from tests.helpers.ports import free_port
from tests.helpers.prometheus import Alertmanager, Kvwatch, WebhookReceiver, find_binary

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
SCHEMAS = REPO / "tests" / "fixtures" / "schemas"
EXAMPLE = DEPLOY / "overlays" / "example"
SIDECAR = DEPLOY / "components" / "sidecar"
OVERLAYS = sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
# Everything a user may `kubectl apply -k`: the overlays, and the bases meant to be applied on their own.
RENDERABLE = OVERLAYS + [DEPLOY / "monitoring", DEPLOY / "alertmanager"]
WEB_CONFIG = DEPLOY / "components" / "web-config"
# The example with the optional web-config component added (a test fixture: its hash is a placeholder).
WITH_WEB_CONFIG = REPO / "tests" / "fixtures" / "deploy" / "web-config"
# The example with the HPA + prometheus-adapter autoscaling component (deploy/overlays/autoscaling has KEDA's).
WITH_HPA = REPO / "tests" / "fixtures" / "deploy" / "autoscaling-hpa"
CHECKED = RENDERABLE + [WITH_WEB_CONFIG, WITH_HPA]
KUBERNETES_VERSIONS = ["1.29.0", latest_version()]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

LABEL = "kvwatch/sidecar"
SCHEDULER_ENV = {  # kvwatch env -> vLLM flag it mirrors
    "KVWATCH_MAX_NUM_SEQS": "--max-num-seqs",
    "KVWATCH_MAX_NUM_BATCHED_TOKENS": "--max-num-batched-tokens",
    "KVWATCH_MAX_MODEL_LEN": "--max-model-len",
}


def _id(path: Path) -> str:
    return str(path.relative_to(DEPLOY if path.is_relative_to(DEPLOY) else REPO))


# -- rendering ---------------------------------------------------------------------------------------------


def kubectl() -> str:
    path = shutil.which("kubectl")
    if not path:
        pytest.fail("kubectl (with its built-in kustomize) is not installed; .ci/run installs it")
    return path


def kustomize(path: Path) -> list[dict]:
    proc = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@functools.cache
def _render(path: str) -> tuple[dict, ...]:
    return tuple(kustomize(Path(path)))


def render(path: Path) -> list[dict]:
    return copy.deepcopy(list(_render(str(path))))


def is_builtin(doc: dict) -> bool:
    group = doc["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def resolved_env(container: dict, docs: list[dict]) -> dict[str, str]:
    """The container's env as the kubelet gives it: values, and ConfigMap keys looked up in the rendered ``docs``."""
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = configmaps[ref["name"]][ref["key"]]
    return env


def pod_templates(docs: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            out.append((f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]))
        elif d["kind"] == "CronJob":
            out.append((f"CronJob/{d['metadata']['name']}", d["spec"]["jobTemplate"]["spec"]["template"]))
        elif d["kind"] == "Pod":
            out.append((f"Pod/{d['metadata']['name']}", d))
    return out


def kvwatch_container(template: dict) -> dict:
    (c,) = [c for c in template["spec"].get("initContainers", []) if c["name"] == "kvwatch"]
    return c


def example_deployment() -> dict:
    (d,) = [d for d in render(EXAMPLE) if d["kind"] == "Deployment" and d["metadata"]["labels"].get(LABEL) == "true"]
    return d


def settings():
    """kvwatch's configuration model: the single source of truth for names and defaults."""
    from kvwatch.config import Settings

    return Settings


def default_port() -> int:
    return int(settings().model_fields["listen"].default.rpartition(":")[2])


def settings_env_names() -> set[str]:
    Settings = settings()
    prefix = Settings.model_config["env_prefix"]
    names = set()
    for name, f in Settings.model_fields.items():
        names.add((prefix + name).upper())
        if isinstance(f.validation_alias, str):
            names.add(f.validation_alias.upper())
    return names


# -- renders, in sync --------------------------------------------------------------------------------------


def test_the_example_overlay_and_the_alertmanager_overlay_exist():
    assert {p.name for p in OVERLAYS} >= {"example", "alertmanager"}


def test_monitoring_references_alerts_and_grafana():
    """deploy/monitoring/ lists alerts/ and grafana/ as kustomization directories (kustomize may load those
    anywhere, while it reads plain files only below its own directory), so it holds no copy that could drift."""
    resources = yaml.safe_load((DEPLOY / "monitoring" / "kustomization.yaml").read_text()).get("resources") or []
    for directory in ("alerts", "grafana"):
        assert (REPO / directory / "kustomization.yaml").is_file(), directory
        assert f"../../{directory}" in resources, directory
    assert [p.name for p in (DEPLOY / "monitoring").iterdir()] == ["kustomization.yaml"]


def test_monitoring_renders_the_generated_rule_and_dashboards():
    """What deploy/monitoring/ applies is the committed alerts/prometheusrule.yaml and grafana/dashboards/*.json."""
    docs = render(DEPLOY / "monitoring")
    assert [d for d in docs if d["kind"] == "PrometheusRule"] == [
        yaml.safe_load((REPO / "alerts" / "prometheusrule.yaml").read_text())
    ]
    dashboards = {key: body for d in docs if d["kind"] == "ConfigMap" for key, body in d["data"].items()}
    assert dashboards == {p.name: p.read_text() for p in (REPO / "grafana" / "dashboards").glob("*.json")}


@pytest.mark.parametrize("path", CHECKED, ids=_id)
def test_renders_with_plain_kubectl_kustomize(path):
    docs = render(path)
    assert docs, f"{path} renders nothing"
    keys = [(d["apiVersion"], d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    for d in docs:
        assert d["metadata"]["name"], d
    text = (path / "kustomization.yaml").read_text()
    assert "load-restrictor" not in text.lower()


def test_example_holds_the_whole_stack():
    kinds = {}
    for d in render(EXAMPLE):
        kinds.setdefault(d["kind"], set()).add(d["metadata"]["name"])
    assert {"Namespace", "Deployment", "Service", "ConfigMap", "PodMonitor", "NetworkPolicy"} <= set(kinds)
    assert kinds["PodMonitor"] == {"kvwatch", "vllm"}
    if (REPO / "alerts" / "prometheusrule.yaml").is_file():
        assert "PrometheusRule" in kinds
    dashboards = [
        d
        for d in render(EXAMPLE)
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert dashboards, "the dashboards ship as ConfigMaps labelled grafana_dashboard=1"
    for cm in dashboards:
        # client-side `kubectl apply` keeps a copy in an annotation limited to 256 KiB
        assert len(yaml.safe_dump(cm)) < 256 * 1024, cm["metadata"]["name"]


# -- schemas -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", CHECKED, ids=_id)
def test_builtin_kinds_validate_strictly(path, version, tmp_path):
    docs = [d for d in render(path) if is_builtin(d)]
    assert docs
    manifest = tmp_path / "builtin.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, str(manifest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # kubernetes-validate only *warns* (exit 0) when it has no schema for a kind: require a pass for each.
    passed = re.findall(r"^INFO .* passed for resource (\S+) against version", proc.stdout, re.M)
    assert len(passed) == len(docs), out
    assert "WARN" not in out and "ERROR" not in out, out


def _crds() -> dict[tuple[str, str, str], dict]:
    schemas = {}
    for f in sorted(SCHEMAS.glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        for v in crd["spec"]["versions"]:
            schemas[(crd["spec"]["group"], v["name"], crd["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return schemas


def _strict(schema):
    """Reject unknown fields where the CRD lists the known ones (as the API server's strict validation)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def validate_custom(doc: dict) -> None:
    group, version = doc["apiVersion"].split("/")
    schema = _crds().get((group, version, doc["kind"]))
    assert schema is not None, f"no CRD schema for {doc['apiVersion']} {doc['kind']} in {SCHEMAS}"
    schema = _strict(schema)
    # metadata is validated by the API server, not the CRD schema; it must still be an ObjectMeta-like map.
    schema["properties"]["metadata"] = {"type": "object"}
    jsonschema.Draft7Validator(schema).validate(doc)


@pytest.mark.parametrize("path", CHECKED, ids=_id)
def test_custom_resources_validate_against_the_operator_crds(path):
    custom = [d for d in render(path) if not is_builtin(d)]
    for d in custom:
        assert d["kind"] in ("PodMonitor", "PrometheusRule", "ScaledObject"), f"no schema to check {d['kind']} against"
        validate_custom(d)
    if path in (EXAMPLE, WITH_WEB_CONFIG):
        assert {d["kind"] for d in custom} >= {"PodMonitor"}


def test_crd_validation_rejects_a_misspelt_field():
    (pm,) = [d for d in render(EXAMPLE) if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "kvwatch"]
    validate_custom(pm)
    pm["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        validate_custom(pm)
    pm["spec"]["podMetricsEndpoints"][0].pop("intervall")
    pm["spec"]["podMetricsEndpoints"][0]["port"] = 9847  # a name, not a number
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(pm)


# -- Pod Security "restricted" -----------------------------------------------------------------------------

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_violations(spec: dict) -> list[str]:
    """The Pod Security Standards' baseline + restricted checks (Kubernetes 1.29+) on one pod spec."""
    bad = []
    pod_sc = spec.get("securityContext", {})
    containers = spec.get("initContainers", []) + spec.get("containers", []) + spec.get("ephemeralContainers", [])
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("pod hostProcess")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: {sorted(kinds)}")
    for s in pod_sc.get("sysctls", []):
        if s["name"] not in SAFE_SYSCTLS:
            bad.append(f"sysctl {s['name']}")
    if pod_sc.get("runAsUser") == 0:
        bad.append("pod runAsUser 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        bad.append(f"pod seccomp {pod_seccomp}")
    for c in containers:
        sc = c.get("securityContext", {})
        n = c["name"]
        if sc.get("privileged"):
            bad.append(f"{n}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"{n}: hostProcess")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{n}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{n}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{n}: adds capabilities {caps['add']}")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            bad.append(f"{n}: runAsNonRoot must be true")
        if sc.get("runAsUser") == 0:
            bad.append(f"{n}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{n}: seccompProfile must be RuntimeDefault or Localhost")
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"{n}: procMount")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                bad.append(f"{n}: hostPort")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("user") or selinux.get("role"):
            bad.append(f"{n}: seLinuxOptions user/role")
    return bad


@pytest.mark.parametrize("path", OVERLAYS + [WITH_WEB_CONFIG], ids=_id)
def test_every_pod_meets_the_restricted_pod_security_standard(path):
    for name, template in pod_templates(render(path)):
        assert restricted_violations(template["spec"]) == [], name


def test_the_restricted_check_catches_a_root_container():
    template = example_deployment()["spec"]["template"]
    assert restricted_violations(template["spec"]) == []
    spec = copy.deepcopy(template["spec"])
    spec["securityContext"].pop("runAsNonRoot")
    spec["securityContext"].pop("seccompProfile")
    spec["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    found = " ".join(restricted_violations(spec))
    assert "vllm: runAsNonRoot" in found and "vllm: capabilities" in found and "vllm: seccomp" in found
    assert "vllm: allowPrivilegeEscalation" in found and "kvwatch" not in found, found


def test_example_namespace_enforces_restricted():
    (ns,) = [d for d in render(EXAMPLE) if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["metadata"].get("namespace") for d in render(EXAMPLE) if d["kind"] != "Namespace"} == {
        ns["metadata"]["name"]
    }


def test_kvwatch_container_security_context():
    sc = kvwatch_container(example_deployment()["spec"]["template"])["securityContext"]
    dockerfile_user = re.findall(r"^USER\s+(\d+):(\d+)\s*$", (REPO / "Dockerfile").read_text(), re.M)[-1]
    assert sc == {
        "runAsNonRoot": True,
        "runAsUser": int(dockerfile_user[0]),
        "runAsGroup": int(dockerfile_user[1]),
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# -- the native sidecar ------------------------------------------------------------------------------------


def test_kvwatch_is_a_native_sidecar():
    template = example_deployment()["spec"]["template"]
    spec = template["spec"]
    assert "kvwatch" not in [c["name"] for c in spec["containers"]]
    kv = kvwatch_container(template)
    assert kv["restartPolicy"] == "Always"
    assert template["metadata"]["labels"][LABEL] == "true"
    # the only writable path is a memory-backed emptyDir on /tmp
    (mount,) = kv["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert vol["emptyDir"]["medium"] == "Memory" and "sizeLimit" in vol["emptyDir"]


def test_probes_use_kvwatchs_endpoints_and_not_vllm():
    kv = kvwatch_container(example_deployment()["spec"]["template"])
    assert kv["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert kv["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in kv:
            assert kv[probe]["httpGet"]["port"] in ("kvwatch", default_port()), probe


def _qos(spec: dict) -> str:
    """Kubernetes' QoS class (pkg/apis/core/helper/qos), over containers and init containers."""
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    requests, limits, guaranteed = {}, {}, True
    for c in containers:
        r = c.get("resources", {})
        req = {k: v for k, v in (r.get("requests") or {}).items() if k in ("cpu", "memory")}
        lim = {k: v for k, v in (r.get("limits") or {}).items() if k in ("cpu", "memory")}
        requests.update(req)
        limits.update(lim)
        if set(lim) != {"cpu", "memory"}:
            guaranteed = False
        for k, v in req.items():
            if lim.get(k) != v:
                guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def test_sidecar_keeps_a_guaranteed_gpu_pod_guaranteed():
    spec = example_deployment()["spec"]["template"]["spec"]
    kv = kvwatch_container({"spec": spec})
    assert kv["resources"]["requests"] == kv["resources"]["limits"], "requests = limits (Guaranteed QoS)"
    assert _qos(spec) == "Guaranteed"
    (vllm,) = spec["containers"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # and the check is not vacuous: a sidecar with requests < limits demotes the whole pod
    spec["initContainers"][0]["resources"]["requests"]["memory"] = "64Mi"
    assert _qos(spec) == "Burstable"


# -- one source of truth: kvwatch's own defaults -----------------------------------------------------------


def test_ports_env_names_and_image_match_kvwatch():
    docs = render(EXAMPLE)
    deployment = example_deployment()
    kv = kvwatch_container(deployment["spec"]["template"])
    port = default_port()
    (p,) = kv["ports"]
    assert p["containerPort"] == port and p["name"] == "kvwatch"
    env = {e["name"]: e for e in kv["env"]}
    assert set(env) <= settings_env_names(), f"not kvwatch settings: {set(env) - settings_env_names()}"
    assert set(SCHEDULER_ENV) <= set(env)
    listen = env["KVWATCH_LISTEN"]["value"]
    assert listen == settings().model_fields["listen"].default
    target = env["KVWATCH_TARGET"]["value"]
    (vllm,) = deployment["spec"]["template"]["spec"]["containers"]
    vllm_port = next(p["containerPort"] for p in vllm["ports"] if p["name"] == "http")
    assert target == f"http://127.0.0.1:{vllm_port}/metrics"
    assert f"--port={vllm_port}" in vllm["args"]

    # the image: kvwatch's version, from the Dockerfile build
    version = PYPROJECT["project"]["version"]
    sidecar_patch = yaml.safe_load((SIDECAR / "sidecar.yaml").read_text())
    (init,) = sidecar_patch["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == f"kvwatch:{version}"
    assert kv["image"].endswith(f"/kvwatch:{version}")
    import kvwatch

    assert kvwatch.__version__ == version

    # everything that points at kvwatch's port points at the same one
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "kvwatch"]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == p["name"] and ep["path"] == "/metrics"


@pytest.mark.slow
def test_kvwatch_runs_with_the_manifest_env_and_answers_the_probes(tmp_path):
    """The real kvwatch, given exactly the sidecar's env (ConfigMap values resolved), accepts every setting
    and serves the probe paths with 200 while its vLLM target is unreachable."""
    docs = render(EXAMPLE)
    kv = kvwatch_container(example_deployment()["spec"]["template"])
    env = resolved_env(kv, docs)
    assert {k: env[k] for k in SCHEDULER_ENV} == {
        "KVWATCH_MAX_NUM_SEQS": "128",
        "KVWATCH_MAX_NUM_BATCHED_TOKENS": "8192",
        "KVWATCH_MAX_MODEL_LEN": "8192",
    }
    # Loopback only in tests: a closed port stands in for vLLM (still loading); --listen overrides the
    # manifest's 0.0.0.0:9847, checked above.
    env["KVWATCH_TARGET"] = f"http://127.0.0.1:{free_port()}/metrics"
    ready_path = kv["readinessProbe"]["httpGet"]["path"]
    with Kvwatch(kv["args"], tmp_path, env=env, ready_path=ready_path) as proc:
        for probe in ("livenessProbe", "readinessProbe"):
            r = httpx.get(proc.url + kv[probe]["httpGet"]["path"], timeout=5, trust_env=False)
            assert r.status_code == 200, probe
        diag = httpx.get(proc.url + "/api/v1/diagnosis", timeout=5, trust_env=False)
        assert diag.status_code == 200
        assert "unreachable" in diag.text


# -- ConfigMap wiring --------------------------------------------------------------------------------------


def test_kvwatch_and_vllm_read_the_same_configmap_keys():
    spec = example_deployment()["spec"]["template"]["spec"]
    kv = kvwatch_container({"spec": spec})
    (vllm,) = spec["containers"]
    vllm_env = {e["name"]: e for e in vllm["env"]}
    configmaps = {d["metadata"]["name"] for d in render(EXAMPLE) if d["kind"] == "ConfigMap"}
    for e in kv["env"]:
        if e["name"] not in SCHEDULER_ENV:
            continue
        ref = e["valueFrom"]["configMapKeyRef"]
        assert ref["name"] in configmaps, "the hashed generator name reaches the sidecar too"
        flag = SCHEDULER_ENV[e["name"]]
        # the vLLM env var that feeds this flag ...
        (arg,) = [a for a in vllm["args"] if a.startswith(flag + "=")]
        var = re.fullmatch(re.escape(flag) + r"=\$\((\w+)\)", arg)[1]
        vref = vllm_env[var]["valueFrom"]["configMapKeyRef"]
        # ... reads the same ConfigMap and key
        assert (vref["name"], vref["key"]) == (ref["name"], ref["key"]), e["name"]


# -- attaching to your own Deployment (the three steps of README.md and deploy/README.md) -----------------


def test_component_attaches_to_your_own_deployment_only(tmp_path):
    user = tmp_path / "my-vllm"
    user.mkdir()
    (user / "deployment.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: my-vllm
          labels:
            kvwatch/sidecar: "true"
        spec:
          selector:
            matchLabels: {app: my-vllm}
          template:
            metadata:
              labels: {app: my-vllm}
            spec:
              initContainers:
                - name: fetch-model
                  image: busybox:1.36
              containers:
                - name: vllm
                  image: vllm/vllm-openai:v0.32.0
                  ports: [{containerPort: 8000}]
              volumes:
                - name: cache
                  emptyDir: {}
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: router
        spec:
          selector:
            matchLabels: {app: router}
          template:
            metadata:
              labels: {app: router}
            spec:
              containers:
                - name: router
                  image: router:1.0
        """)
    )
    rel = os.path.relpath(DEPLOY / "components", user)
    (user / "kustomization.yaml").write_text(
        textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources:
          - deployment.yaml
        components:
          - {rel}/sidecar
          - {rel}/podmonitors
        images:
          - name: kvwatch
            newName: registry.example.com/kvwatch
            newTag: "{PYPROJECT["project"]["version"]}"
        """)
    )
    docs = kustomize(user)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    spec = deployments["my-vllm"]["spec"]["template"]["spec"]
    # the merge puts kvwatch first: it starts before the pod's own init containers and watches the load
    assert [c["name"] for c in spec["initContainers"]] == ["kvwatch", "fetch-model"]
    assert [c["name"] for c in spec["containers"]] == ["vllm"]
    assert {v["name"] for v in spec["volumes"]} == {"cache", "kvwatch-tmp"}
    assert deployments["my-vllm"]["spec"]["template"]["metadata"]["labels"] == {"app": "my-vllm", LABEL: "true"}
    assert (
        kvwatch_container({"spec": spec})["image"] == f"registry.example.com/kvwatch:{PYPROJECT['project']['version']}"
    )
    assert "initContainers" not in deployments["router"]["spec"]["template"]["spec"]
    assert LABEL not in deployments["router"]["spec"]["template"]["metadata"]["labels"]
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor"} == {"kvwatch", "vllm"}


def kustomization_snippets(page: Path, root: str) -> dict:
    """The page's kustomization snippets (yaml blocks whose first line is ``# kustomization.yaml...``), with
    ``<kvwatch>`` pointing at ``root``, merged into one kustomization as a reader adds them to theirs."""
    fenced = re.findall(r"^( *)```yaml\n(.*?)^\1```", page.read_text(), re.M | re.S)  # in a list item: indented
    blocks = [b for b in (textwrap.dedent(text) for _, text in fenced) if b.startswith("# kustomization.yaml")]
    merged: dict = {}
    for block in blocks:
        for key, value in yaml.safe_load(block.replace("<kvwatch>", root)).items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
            else:
                assert merged.setdefault(key, value) == value, key
    return merged | {"_blocks": len(blocks)}


def _write_user_kustomization(tmp_path: Path, page: Path) -> tuple[Path, dict]:
    user = tmp_path / "my-vllm"
    user.mkdir()
    (user / "vllm-deployment.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: my-vllm
          labels:
            kvwatch/sidecar: "true"
        spec:
          selector:
            matchLabels: {app: my-vllm}
          template:
            metadata:
              labels: {app: my-vllm}
            spec:
              containers:
                - name: vllm
                  image: vllm/vllm-openai:v0.32.0
                  ports: [{containerPort: 8000}]
        """)
    )
    snippets = kustomization_snippets(page, os.path.relpath(REPO, user))
    (user / "kustomization.yaml").write_text(yaml.safe_dump({k: v for k, v in snippets.items() if k != "_blocks"}))
    return user, snippets


def test_the_readmes_three_steps_render_as_written(tmp_path):
    """README.md's kustomization, copied as it stands next to a Deployment of one's own, attaches kvwatch."""
    user, snippets = _write_user_kustomization(tmp_path, REPO / "README.md")
    assert snippets["_blocks"] == 1
    docs = kustomize(user)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    image = kvwatch_container(deployment["spec"]["template"])["image"]
    assert image == "registry.example.com/kvwatch:" + PYPROJECT["project"]["version"]
    assert {d["kind"] for d in docs} >= {"PodMonitor", "PrometheusRule", "NetworkPolicy", "ConfigMap"}


def test_deploy_readmes_snippets_work_as_written(tmp_path):
    """deploy/README.md's snippets (the three steps, kube-prometheus-stack's release label, the NetworkPolicy's
    selectors, another vLLM port), all added to one kustomization, do what the page says and nothing more."""
    user, snippets = _write_user_kustomization(tmp_path, DEPLOY / "README.md")
    assert snippets["_blocks"] == 4
    docs = kustomize(user)
    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    release = [d["metadata"]["name"] for d in docs if "release" in d["metadata"].get("labels", {})]
    assert sorted(release) == sorted(d["metadata"]["name"] for d in by_kind["PodMonitor"] + by_kind["PrometheusRule"])
    assert len(by_kind["PodMonitor"]) == 2 and len(by_kind["PrometheusRule"]) == 1
    (policy,) = [d for d in by_kind["NetworkPolicy"] if d["metadata"]["name"] == "kvwatch-allow-prometheus"]
    (peer,) = policy["spec"]["ingress"][0]["from"]
    wanted = {
        op["path"]: op["value"]
        for p in snippets["patches"]
        if p["target"]["kind"] == "NetworkPolicy"
        for op in yaml.safe_load(p["patch"])
    }
    assert peer["namespaceSelector"]["matchLabels"] == wanted["/spec/ingress/0/from/0/namespaceSelector/matchLabels"]
    assert peer["podSelector"]["matchLabels"] == wanted["/spec/ingress/0/from/0/podSelector/matchLabels"]
    assert peer["namespaceSelector"]["matchLabels"] != {"kubernetes.io/metadata.name": "monitoring"}
    (deployment,) = by_kind["Deployment"]
    kvwatch = kvwatch_container(deployment["spec"]["template"])
    target = [e for e in kvwatch["env"] if e["name"] == "KVWATCH_TARGET"]
    assert target == [{"name": "KVWATCH_TARGET", "value": "http://127.0.0.1:8080/metrics"}], "the patch replaced it"
    assert kvwatch["image"] == "registry.example.com/kvwatch:" + PYPROJECT["project"]["version"]
    dashboards = [d for d in by_kind["ConfigMap"] if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == len(list((REPO / "grafana" / "dashboards").glob("*.json")))
    assert all(d["metadata"]["annotations"]["grafana_folder"] == "kvwatch" for d in dashboards)


# -- scraping and network policy ---------------------------------------------------------------------------


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and not selector.get(
        "matchExpressions"
    )


def test_podmonitors_scrape_kvwatch_and_vllm():
    docs = render(EXAMPLE)
    template = example_deployment()["spec"]["template"]
    spec = template["spec"]
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    for pm in monitors.values():
        assert _selects(pm["spec"]["selector"], template["metadata"]["labels"]), pm["metadata"]["name"]
    kv_ports = {p["name"] for p in kvwatch_container(template)["ports"]}
    (ep,) = monitors["kvwatch"]["spec"]["podMetricsEndpoints"]
    assert ep["port"] in kv_ports
    (ep,) = monitors["vllm"]["spec"]["podMetricsEndpoints"]
    assert ep["path"] == "/metrics"
    assert ep["portNumber"] in {p["containerPort"] for p in spec["containers"][0]["ports"]}, (
        "a PodMonitor only scrapes declared ports"
    )


def _resolve_port(port, pod_spec: dict) -> int:
    if isinstance(port, int):
        return port
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == port:
                return p["containerPort"]
    raise AssertionError(f"named port {port!r} is not declared")


def test_networkpolicy_admits_only_prometheus_to_kvwatchs_port():
    docs = render(EXAMPLE)
    template = example_deployment()["spec"]["template"]
    labels, spec = template["metadata"]["labels"], template["spec"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy" and _selects(d["spec"]["podSelector"], labels)]
    assert any(p["metadata"]["name"] == "kvwatch-allow-prometheus" for p in policies)
    port = default_port()
    admitted = []
    for pol in policies:
        assert "Ingress" in pol["spec"]["policyTypes"]
        for rule in pol["spec"].get("ingress", []):
            ports = {_resolve_port(p["port"], spec) for p in rule.get("ports", [])} or {"all"}
            if port in ports or "all" in ports:
                admitted.append(rule.get("from"))
    assert admitted, "some rule admits Prometheus to kvwatch's port"
    for peers in admitted:
        assert peers, "a rule opens kvwatch's port to every source"
        for peer in peers:
            assert peer.get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "prometheus"}
            assert "namespaceSelector" in peer and "ipBlock" not in peer
    # vLLM's API stays reachable for its clients (the example's own policy)
    vllm_port = next(p["containerPort"] for p in spec["containers"][0]["ports"] if p["name"] == "http")
    assert any(
        vllm_port in {_resolve_port(p["port"], spec) for p in r.get("ports", [])} and not r.get("from")
        for pol in policies
        for r in pol["spec"].get("ingress", [])
    )


# -- the optional web-config component: TLS and basic auth on kvwatch's port ------------------------------

PLACEHOLDER = "REPLACE-WITH-THE-BCRYPT-HASH-OF-THE-SCRAPE-PASSWORD"
MOUNT_ROOT = "/etc/kvwatch/"


def _web_config_template() -> dict:
    (d,) = [
        d for d in render(WITH_WEB_CONFIG) if d["kind"] == "Deployment" and d["metadata"]["labels"].get(LABEL) == "true"
    ]
    return d["spec"]["template"]


def _secret_file(template: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file ``path`` the kvwatch container sees: a read-only Secret mount of its
    directory, without subPath (a subPath mount never receives the kubelet's updates)."""
    directory, _, name = path.rpartition("/")
    (mount,) = [m for m in kvwatch_container(template)["volumeMounts"] if m["mountPath"] == directory]
    assert mount.get("readOnly") is True and "subPath" not in mount, mount
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    items = {i["path"]: i["key"] for i in secret.get("items", [])}
    assert not items or name in items, f"{name} is not projected from {secret['secretName']}"
    return secret["secretName"], items.get(name, name)


def _rendered_web_config() -> tuple[str, str]:
    """(the path KVWATCH_WEB_CONFIG_FILE names, the text of the file there, from the rendered Secret)."""
    template = _web_config_template()
    path = {e["name"]: e.get("value") for e in kvwatch_container(template)["env"]}["KVWATCH_WEB_CONFIG_FILE"]
    secret, key = _secret_file(template, path)
    (doc,) = [d for d in render(WITH_WEB_CONFIG) if d["kind"] == "Secret" and d["metadata"]["name"] == secret]
    return path, base64.b64decode(doc["data"][key]).decode()


def test_web_config_component_mounts_the_secrets_where_the_config_says():
    template = _web_config_template()
    path, text = _rendered_web_config()
    assert "KVWATCH_WEB_CONFIG_FILE" in settings_env_names()
    config = yaml.safe_load(text)
    tls = config["tls_server_config"]
    assert _secret_file(template, tls["cert_file"]) == ("kvwatch-tls", "tls.crt")  # kubernetes.io/tls keys,
    assert _secret_file(template, tls["key_file"]) == ("kvwatch-tls", "tls.key")  # as cert-manager writes them
    assert list(config["basic_auth_users"].values()) == [PLACEHOLDER]
    (secret,) = [d for d in render(WITH_WEB_CONFIG) if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "kvwatch-web-config", "no hash suffix: an update reaches the pod"
    (deployment,) = [d for d in render(WITH_WEB_CONFIG) if d["kind"] == "Deployment"]
    assert secret["metadata"].get("namespace") == deployment["metadata"]["namespace"], (
        "a volume's Secret: same namespace"
    )


def test_web_config_component_changes_only_what_tls_and_auth_need():
    """The sidecar gains the env var, two read-only mounts and HTTPS probes, nothing else; the kvwatch PodMonitor
    gains scheme, tlsConfig and basicAuth, nothing else; the vllm PodMonitor is untouched."""
    kv = kvwatch_container(_web_config_template())
    plain = kvwatch_container(example_deployment()["spec"]["template"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert kv[probe]["httpGet"].pop("scheme") == "HTTPS", probe
    kv["env"] = [e for e in kv["env"] if e["name"] != "KVWATCH_WEB_CONFIG_FILE"]
    kv["volumeMounts"] = [m for m in kv["volumeMounts"] if not m["mountPath"].startswith(MOUNT_ROOT)]
    assert kv == plain
    spec = _web_config_template()["spec"]
    assert {v["name"] for v in spec["volumes"]} - {
        v["name"] for v in example_deployment()["spec"]["template"]["spec"]["volumes"]
    } == {"kvwatch-web-config", "kvwatch-tls"}

    monitors = {d["metadata"]["name"]: d for d in render(WITH_WEB_CONFIG) if d["kind"] == "PodMonitor"}
    plain_monitors = {d["metadata"]["name"]: d for d in render(EXAMPLE) if d["kind"] == "PodMonitor"}
    assert monitors["vllm"] == plain_monitors["vllm"]
    (ep,) = monitors["kvwatch"]["spec"]["podMetricsEndpoints"]
    assert ep.pop("scheme") == "https"
    assert ep.pop("tlsConfig") == {"ca": {"secret": {"name": "kvwatch-tls", "key": "ca.crt"}}, "serverName": "kvwatch"}
    assert ep.pop("basicAuth") == {
        "username": {"name": "kvwatch-scrape-auth", "key": "username"},
        "password": {"name": "kvwatch-scrape-auth", "key": "password"},
    }
    assert monitors["kvwatch"] == plain_monitors["kvwatch"]


def _lay_out_secrets(root: Path, text: str, leaf, hashed: str | None) -> Path:
    """The rendered web config and a test certificate as the kubelet would mount them, under ``root`` instead of
    /etc/kvwatch; the placeholder replaced by ``hashed`` (if given). Returns the web config's path."""
    path, _ = _rendered_web_config()
    local = root / path.removeprefix(MOUNT_ROOT)
    local.parent.mkdir(parents=True, exist_ok=True)
    text = text.replace(MOUNT_ROOT, f"{root}/")
    local.write_text(text.replace(PLACEHOLDER, hashed) if hashed else text)
    (root / "tls").mkdir(exist_ok=True)
    (root / "tls" / "tls.crt").write_bytes(leaf.cert.read_bytes())
    (root / "tls" / "tls.key").write_bytes(leaf.key.read_bytes())
    return local


def test_kvwatch_refuses_the_shipped_placeholder_hash(tmp_path):
    """No default password: with the component's web-config.yml as shipped, kvwatch does not start."""
    from kvwatch.webconfig import WebConfigError, load

    leaf = Ca(tmp_path / "ca").issue(tmp_path / "leaf", dns=("kvwatch",))
    _, text = _rendered_web_config()
    with pytest.raises(WebConfigError, match=r"basic_auth_users\.prometheus: not a bcrypt hash"):
        load(_lay_out_secrets(tmp_path / "etc", text, leaf, hashed=None))
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    loaded = load(_lay_out_secrets(tmp_path / "etc", text, leaf, hashed))
    assert loaded.tls is not None and set(loaded.users) == {"prometheus"}


@pytest.mark.slow
def test_kvwatch_with_the_web_config_component_serves_probes_openly_and_metrics_with_the_password(tmp_path):
    """The real kvwatch with the rendered sidecar's env and the Secrets' files: the probes answer over HTTPS without
    credentials, /metrics only with the password, and the certificate verifies for the PodMonitor's serverName."""
    docs = render(WITH_WEB_CONFIG)
    template = _web_config_template()
    kv = kvwatch_container(template)
    ca = Ca(tmp_path / "ca")
    leaf = ca.issue(tmp_path / "leaf", dns=("kvwatch",))
    password = "scrape-password-2718"
    _, text = _rendered_web_config()
    local = _lay_out_secrets(
        tmp_path / "etc", text, leaf, bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()
    )
    env = resolved_env(kv, docs)
    env["KVWATCH_WEB_CONFIG_FILE"] = str(local)
    env["KVWATCH_TARGET"] = f"http://127.0.0.1:{free_port()}/metrics"  # vLLM still loading
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "kvwatch"]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    with Kvwatch(
        kv["args"], tmp_path, env=env, ready_path=kv["readinessProbe"]["httpGet"]["path"], ca_file=ca.cert
    ) as proc:
        assert proc.url.startswith(ep["scheme"] + "://")
        for probe in ("livenessProbe", "readinessProbe"):
            get = kv[probe]["httpGet"]
            assert get["scheme"] == "HTTPS"
            # the kubelet does not verify a probe's certificate
            r = httpx.get(proc.url + get["path"], timeout=10, trust_env=False, verify=False)
            assert r.status_code == 200, probe
        metrics = proc.url + ep["path"]
        denied = proc._http.get(metrics)
        assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Basic"
        assert denied.headers["X-Content-Type-Options"] == "nosniff"
        user = next(iter(yaml.safe_load(local.read_text())["basic_auth_users"]))
        assert proc._http.get(metrics, auth=(user, password)).status_code == 200
        ctx = ssl.create_default_context(cafile=str(ca.cert))
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname=ep["tlsConfig"]["serverName"]) as tls:
                assert tls.getpeercert()["subjectAltName"]


# -- Alertmanager ------------------------------------------------------------------------------------------

RECEIVERS_DIR = "/etc/alertmanager/secrets/kvwatch-alertmanager-receivers/"


def _alertmanager_secrets() -> dict[str, dict[str, bytes]]:
    docs = render(DEPLOY / "overlays" / "alertmanager")
    return {
        d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()}
        for d in docs
        if d["kind"] == "Secret"
    }


def test_alertmanager_config_has_no_inline_credentials():
    secrets = _alertmanager_secrets()
    config = yaml.safe_load(secrets["kvwatch-alertmanager-config"]["alertmanager.yaml"])
    keys = set(secrets["kvwatch-alertmanager-receivers"])
    seen = set()
    for receiver in config["receivers"]:
        for kind, configs in receiver.items():
            if kind == "name":
                continue
            for c in configs:
                for inline in ("api_url", "routing_key", "service_key", "url", "api_key", "bot_token"):
                    assert inline not in c, f"{receiver['name']}: {inline} inline; use {inline}_file"
                for k, v in c.items():
                    if k.endswith("_file"):
                        assert v.startswith(RECEIVERS_DIR), v
                        seen.add(v.removeprefix(RECEIVERS_DIR))
    assert seen == keys, "every key file is used, every used file is in the Secret"


@pytest.mark.slow
def test_alertmanager_config_checks_and_routes_by_severity(tmp_path):
    config = tmp_path / "alertmanager.yaml"
    config.write_bytes(_alertmanager_secrets()["kvwatch-alertmanager-config"]["alertmanager.yaml"])
    amtool = find_binary("amtool")
    check = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    cases = {
        ("severity=critical", "alertname=KvwatchKVCacheSaturated"): "pager",
        ("severity=warning", "alertname=KvwatchKVCacheSaturated"): "ticket",
        ("severity=info", "alertname=KvwatchSomething"): "null",
        ("severity=info", "alertname=Watchdog"): "heartbeat",
        ("severity=warning", "alertname=KvwatchDown"): "ticket",
    }
    for labels, receiver in cases.items():
        out = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={config}", *labels], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == receiver, (labels, out.stdout)


@pytest.mark.slow
def test_alertmanager_reads_receiver_keys_from_the_mounted_secret(tmp_path):
    """A real Alertmanager with the rendered config; the receivers Secret laid out as the Prometheus Operator
    mounts it (one file per key); the keys point at a local stand-in for Slack and PagerDuty."""
    secrets = _alertmanager_secrets()
    mount = tmp_path / "secrets"
    mount.mkdir()
    with WebhookReceiver() as rx:
        keys = {
            "slack-api-url": f"{rx.url}/slack".encode(),
            "pagerduty-routing-key": b"test-routing-key-from-file",
        }
        assert set(keys) == set(secrets["kvwatch-alertmanager-receivers"])
        for k, v in keys.items():
            (mount / k).write_bytes(v)
        text = secrets["kvwatch-alertmanager-config"]["alertmanager.yaml"].decode()
        config = yaml.safe_load(text.replace(RECEIVERS_DIR, f"{mount}/"))
        # Only what a test must change: no waiting for groups, and PagerDuty's endpoint is the stand-in.
        config["route"]["group_wait"] = "0s"
        (pager,) = [r for r in config["receivers"] if r["name"] == "pager"]
        pager["pagerduty_configs"][0]["url"] = f"{rx.url}/pagerduty"
        with Alertmanager(config, tmp_path / "am") as am:

            def alert(name, severity, pod, **labels):
                return {
                    "labels": {"alertname": name, "severity": severity, "namespace": "ns", "pod": pod, **labels},
                    "annotations": {"summary": f"{name} test", "description": "d"},
                }

            engine = {"target": "http://127.0.0.1:8000/metrics", "model_name": "m", "engine": "0"}

            def post(alerts):
                r = httpx.post(am.url + "/api/v2/alerts", json=alerts, timeout=10, trust_env=False)
                assert r.status_code == 200, r.text

            # The inhibiting alerts first (as in life: they are already firing), then the rest.
            post(
                [
                    alert("KvwatchKVCacheAdmissionStall", "critical", "c", **engine),  # inhibits its warning
                    alert("KvwatchDown", "warning", "d"),
                ]
            )  # inhibits its pod's other kvwatch alerts
            am.wait_for(lambda: len(am.alerts()) == 2, timeout=30, what="source alerts registered")
            post(
                [
                    alert("KvwatchTestWarning", "warning", "a"),
                    alert("KvwatchTestCritical", "critical", "b"),
                    alert("KvwatchKVCacheAdmissionStall", "warning", "c", **engine),
                    alert("KvwatchMaxNumSeqsBinding", "warning", "d", **engine),
                ]
            )

            def delivered(reqs):
                bodies = {q.path: b"" for q in reqs}
                for q in reqs:
                    bodies[q.path] += q.body
                ok = b"KvwatchTestWarning" in bodies.get("/slack", b"") and b"KvwatchTestCritical" in bodies.get(
                    "/pagerduty", b""
                )
                return reqs if ok else None

            rx.wait_for(delivered, timeout=60, what="Slack and PagerDuty notifications")

            def inhibited():
                state = {
                    (a["labels"]["alertname"], a["labels"]["pod"], a["labels"]["severity"]): a["status"]
                    for a in am.alerts()
                }
                return (
                    state
                    if all(
                        state[k]["inhibitedBy"]
                        for k in (
                            ("KvwatchKVCacheAdmissionStall", "c", "warning"),
                            ("KvwatchMaxNumSeqsBinding", "d", "warning"),
                        )
                    )
                    else None
                )

            state = am.wait_for(inhibited, timeout=60, what="inhibitions")
            for key in (
                ("KvwatchKVCacheAdmissionStall", "c", "critical"),
                ("KvwatchDown", "d", "warning"),
                ("KvwatchTestWarning", "a", "warning"),
            ):
                assert not state[key]["inhibitedBy"], key
            got = rx.snapshot()
    # the Slack URL came from its key file (the requests reached it); so did PagerDuty's routing key
    assert {q.json["routing_key"] for q in got if q.path == "/pagerduty"} == {"test-routing-key-from-file"}
    slack = b"".join(q.body for q in got if q.path == "/slack")
    assert b"KvwatchMaxNumSeqsBinding" not in slack, "inhibited by KvwatchDown on the same pod"
    assert b"KvwatchKVCacheAdmissionStall" not in slack, "the warning is inhibited by its critical twin"
    assert b"KvwatchTestCritical" not in slack, "critical pages, it does not open a ticket"
