"""deploy/daemonset: the kustomization renders to valid, least-privilege objects.

Rendering uses a small reader of the kustomization features the directory uses
(resources, images, configMapGenerator, Component patches: strategic merge, or JSON 6902
`add` operations); it refuses any other kustomization key or patch operation, so it
cannot silently render something different from kustomize.
Built-in kinds are validated against the Kubernetes OpenAPI schemas bundled by the
PyPI package kubernetes-validate (strict: unknown fields are errors) for 1.33, 1.34
and 1.35. PodMonitor and PrometheusRule are custom resources with no schema in that
package: they are checked against JSON schemas written here from the fields of the
Prometheus Operator's monitoring.coreos.com/v1 CRDs, closed to unknown fields.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "daemonset"
K8S_VERSIONS = ("1.33", "1.34", "1.35")
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "configMapGenerator", "patches"}


# ---------------------------------------------------------------- rendering helpers


def _load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _set_image(obj: dict[str, Any], images: list[dict[str, str]]) -> None:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        name = container["image"].rsplit(":", 1)[0]
        for image in images:
            if image["name"] == name:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"


def _strategic_merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize does it for the shapes used here.

    Maps merge key by key; lists of maps with a `name` (containers, volumes, env)
    merge by name; any other list replaces (as capabilities.add does: no merge key).
    """
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _strategic_merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        out_list = [copy.deepcopy(i) for i in base]
        for item in patch:
            for idx, existing in enumerate(out_list):
                if existing["name"] == item["name"]:
                    out_list[idx] = _strategic_merge(existing, item)
                    break
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _json6902(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply JSON patch (RFC 6902) ``add`` operations, as kustomize does for a patch file
    holding a list; any other operation is refused."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add", f"teach _json6902 the {op['op']} operation first"
        *parents, last = op["path"].lstrip("/").split("/")
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            node[last] = copy.deepcopy(op["value"])
    return out


def render(directory: Path, components: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """Render a kustomization directory into its list of objects."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kust) - KUSTOMIZATION_KEYS
    assert not unknown, f"{directory}/kustomization.yaml uses {unknown}: teach render() first"
    assert kust["kind"] == "Kustomization"
    objs: list[dict[str, Any]] = []
    for res in kust.get("resources", []):
        path = directory / res
        assert path.resolve().is_relative_to(DEPLOY), f"{res} leaves deploy/daemonset"
        objs.extend(render(path) if path.is_dir() else _load_docs(path))
    for gen in kust.get("configMapGenerator", []):
        assert gen["options"]["disableNameSuffixHash"] is True
        data = {}
        for entry in gen["files"]:
            key, _, src = entry.partition("=")
            data[key] = (directory / (src or key)).read_text()
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": gen["name"],
                    "namespace": gen["namespace"],
                    "labels": gen["options"]["labels"],
                },
                "data": data,
            }
        )
    for obj in objs:
        _set_image(obj, kust.get("images", []))
    for comp in components:
        ckust = yaml.safe_load((comp / "kustomization.yaml").read_text())
        assert set(ckust) <= KUSTOMIZATION_KEYS and ckust["kind"] == "Component"
        for patch in ckust["patches"]:
            patch_doc: Any = yaml.safe_load((comp / patch["path"]).read_text())
            target = patch["target"]
            hits = [
                i
                for i, o in enumerate(objs)
                if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]
            ]
            assert len(hits) == 1, f"patch target {target} matched {len(hits)} objects"
            if isinstance(patch_doc, list):
                objs[hits[0]] = _json6902(objs[hits[0]], patch_doc)
            else:
                objs[hits[0]] = _strategic_merge(objs[hits[0]], patch_doc)
    return objs


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(DEPLOY)


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _agent_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    ds = _one(objs, "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


# ---------------------------------------------------------------- rendering


def test_kustomization_renders_every_kind_once(objects: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "PodMonitor",
            "PrometheusRule",
            "ConfigMap",
            "ResourceQuota",
        ]
    )
    for obj in objects:
        if obj["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert obj["metadata"]["namespace"] == "zonemeter", obj["kind"]


def test_every_yaml_file_is_listed_in_a_kustomization() -> None:
    listed: set[Path] = set()
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        kust = yaml.safe_load(kfile.read_text())
        listed.add(kfile)
        listed.update(kfile.parent / r for r in kust.get("resources", []))
        listed.update(kfile.parent / p["path"] for p in kust.get("patches", []))
    # Not Kubernetes objects: promtool inputs.
    not_objects = {"rules.yml", "rules_test.yml", "rules_test_weekly.yml"}
    for path in list(DEPLOY.rglob("*.yaml")) + list(DEPLOY.rglob("*.yml")):
        if path.name in not_objects or DEPLOY / "chart" in path.parents:  # Helm chart: test_chart.py
            continue
        assert path in listed, f"{path.relative_to(ROOT)} is in no kustomization"


def test_render_refuses_unknown_kustomization_keys(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("kind: Kustomization\nnamePrefix: x-\n")
    with pytest.raises(AssertionError, match="namePrefix"):
        render(tmp_path)


def test_image_reference_is_the_only_edit(objects: list[dict[str, Any]]) -> None:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    (image,) = kust["images"]
    assert _agent_container(objects)["image"] == f"{image['newName']}:{image['newTag']}"
    assert image["newTag"] != "latest"


# ---------------------------------------------------------------- OpenAPI validation


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_objects_validate_against_openapi(
    objects: list[dict[str, Any]], version: str
) -> None:
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        used = kubernetes_validate.validate(obj, version, strict=True)
        assert used == version, f"validated {obj['kind']} against {used}, not {version}"
        checked += 1
    assert checked == 7


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_legacy_kernel_component_validates(version: str) -> None:
    objs = render(DEPLOY, components=(DEPLOY / "components" / "legacy-kernel",))
    ds = _one(objs, "DaemonSet")
    kubernetes_validate.validate(ds, version, strict=True)
    sc = _agent_container(objs)["securityContext"]
    assert set(sc["capabilities"]["add"]) == {"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN", "SYS_RESOURCE"}
    # The API server rejects SYS_ADMIN with allowPrivilegeEscalation: false.
    assert sc["allowPrivilegeEscalation"] is True
    # The patch merged into the container: mounts and probes are still there.
    assert _agent_container(objs)["volumeMounts"] == _agent_container(render(DEPLOY))["volumeMounts"]


CGROUP_HOOK = DEPLOY / "components" / "cgroup-hook"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_cgroup_hook_component_validates_and_mounts_the_hosts_cgroup_root(version: str) -> None:
    objs = render(DEPLOY, components=(CGROUP_HOOK,))
    ds = _one(objs, "DaemonSet")
    kubernetes_validate.validate(ds, version, strict=True)
    base = _agent_container(render(DEPLOY))
    c = _agent_container(objs)
    # the arguments: the default ones, then the hook and the root the mount provides
    assert c["args"] == base["args"] + ["--hook=cgroup", "--cgroup-root=/run/zonemeter/cgroupv2"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert c["volumeMounts"][:-1] == base["volumeMounts"]
    assert mounts["/run/zonemeter/cgroupv2"] == {"name": "host-cgroup", "mountPath": "/run/zonemeter/cgroupv2",
                                                 "readOnly": True}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-cgroup"]["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    # the mount point is the one --cgroup-root names, and the agent accepts the flag
    from agent.cli import build_parser

    args = build_parser().parse_args(["agent", "--node-name", "n", *c["args"]])
    assert (args.hook, args.cgroup_root) == ("cgroup", "/run/zonemeter/cgroupv2")
    # nothing else changed: capabilities, probes, the other objects
    assert c["securityContext"] == base["securityContext"]
    assert [o for o in objs if o["kind"] != "DaemonSet"] == [o for o in render(DEPLOY) if o["kind"] != "DaemonSet"]


def test_validator_catches_a_wrong_field(objects: list[dict[str, Any]]) -> None:
    ds = copy.deepcopy(_one(objects, "DaemonSet"))
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, "1.35", strict=True)
    ds = copy.deepcopy(_one(objects, "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "11808"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, "1.33", strict=True)


# ---------------------------------------------------------------- RBAC


def test_rbac_is_read_only_on_four_kinds(objects: list[dict[str, Any]]) -> None:
    role = _one(objects, "ClusterRole")
    granted: set[tuple[str, str, str]] = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames/nonResourceURLs"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    wanted = {
        (group, resource, verb)
        for group, resource in [
            ("", "pods"),
            ("", "nodes"),
            ("", "services"),
            ("discovery.k8s.io", "endpointslices"),
        ]
        for verb in ("get", "list", "watch")
    }
    assert granted == wanted
    assert not any("*" in part for grant in granted for part in grant)
    assert "aggregationRule" not in role
    assert not [o for o in objects if o["kind"] in {"Role", "RoleBinding"}]


def test_binding_gives_the_role_to_the_agent_account(objects: list[dict[str, Any]]) -> None:
    binding = _one(objects, "ClusterRoleBinding")
    sa = _one(objects, "ServiceAccount")
    ds = _one(objects, "DaemonSet")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": _one(objects, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


# ---------------------------------------------------------------- DaemonSet


def test_daemonset_runs_on_every_linux_node(objects: list[dict[str, Any]]) -> None:
    ds = _one(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {"operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    # hostNetwork pods bind the node's port: a surge pod could never start.
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_daemonset_network_identity_and_probes(objects: list[dict[str, Any]]) -> None:
    pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod.get("hostPID") is not True and pod.get("hostIPC") is not True
    container = _agent_container(objects)
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 11808)
    assert "--metrics-address=0.0.0.0:11808" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    res = container["resources"]
    assert set(res["requests"]) == {"cpu", "memory"} and set(res["limits"]) == {"cpu", "memory"}


def test_daemonset_security_context_is_narrow(objects: list[dict[str, Any]]) -> None:
    pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert "securityContext" not in pod or "privileged" not in pod["securityContext"]
    sc = _agent_container(objects)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sorted(sc["capabilities"]["add"]) == ["BPF", "NET_ADMIN", "PERFMON"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_daemonset_host_mounts(objects: list[dict[str, Any]]) -> None:
    pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in _agent_container(objects)["volumeMounts"]}
    host = {
        m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
        for m in mounts.values()
        if "hostPath" in volumes[m["name"]]
    }
    assert host == {
        "/host/lib/modules": "/lib/modules",
        "/usr/src": "/usr/src",
        "/sys/fs/bpf": "/sys/fs/bpf",
        "/var/lib/zonemeter": "/var/lib/zonemeter",
    }
    # The checkpoint directory (agent.checkpoint.DEFAULT_CHECKPOINT_PATH's), created on
    # first use, writable: the counters outlive the pod.
    from agent.checkpoint import DEFAULT_CHECKPOINT_PATH

    assert DEFAULT_CHECKPOINT_PATH.startswith("/var/lib/zonemeter/")
    assert volumes[mounts["/var/lib/zonemeter"]["name"]]["hostPath"]["type"] == "DirectoryOrCreate"
    assert mounts["/var/lib/zonemeter"].get("readOnly", False) is False
    # Kernel headers are only read.
    assert mounts["/host/lib/modules"]["readOnly"] is True
    assert mounts["/usr/src"]["readOnly"] is True
    # Pins are files created in the node's bpffs: writable, and host mounts propagate
    # in (Bidirectional would need a privileged container).
    assert mounts["/sys/fs/bpf"].get("readOnly", False) is False
    assert mounts["/sys/fs/bpf"]["mountPropagation"] == "HostToContainer"
    # Container-local writable directories for the header links and BCC's scratch.
    assert "emptyDir" in volumes[mounts["/lib/modules"]["name"]]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    # No other host path (no /, /proc, /var/run, container runtime sockets).
    assert len([v for v in volumes.values() if "hostPath" in v]) == 4


def test_namespace_admits_the_agent_under_pod_security(objects: list[dict[str, Any]]) -> None:
    labels = _one(objects, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_prometheus_annotations_match_the_port(objects: list[dict[str, Any]]) -> None:
    ann = _one(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": "11808", "prometheus.io/path": "/metrics"}


# ---------------------------------------------------------------- CRD objects

_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STR_MAP},
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": _STR_MAP, "matchExpressions": {"type": "array"}},
    "additionalProperties": False,
}
_RELABEL = {
    "type": "object",
    "properties": {
        "action": {
            "enum": [
                "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
                "lowercase", "uppercase", "keepequal", "dropequal",
            ]
        },
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "targetLabel": {"type": "string"},
        "separator": {"type": "string"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "modulus": {"type": "integer"},
    },
    "additionalProperties": False,
}
# Fields of monitoring.coreos.com/v1 PodMonitor used or plausibly used here; closed.
PODMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array"}},
                    "additionalProperties": False,
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
# monitoring.coreos.com/v1 PrometheusRule (all RuleGroup and Rule fields); closed.
PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "properties": {
                                        "record": {"type": "string"},
                                        "alert": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "keep_firing_for": {"type": "string", "pattern": _DURATION},
                                        "labels": _STR_MAP,
                                        "annotations": _STR_MAP,
                                    },
                                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                                    "additionalProperties": False,
                                },
                            },
                        },
                        "additionalProperties": False,
                    },
                }
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}


def test_podmonitor_matches_crd_fields_and_the_daemonset(objects: list[dict[str, Any]]) -> None:
    pm = _one(objects, "PodMonitor")
    jsonschema.validate(pm, PODMONITOR_SCHEMA)
    pod_labels = _one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == _agent_container(objects)["ports"][0]["name"]
    # The Service's namespace/service labels must not be overwritten by target labels.
    assert endpoint["honorLabels"] is True
    # job="zonemeter": the value the alerts select on.
    assert pod_labels[pm["spec"]["jobLabel"]] == "zonemeter"


def test_prometheusrule_matches_crd_fields(objects: list[dict[str, Any]]) -> None:
    jsonschema.validate(_one(objects, "PrometheusRule"), PROMETHEUSRULE_SCHEMA)


def test_crd_schemas_reject_unknown_fields(objects: list[dict[str, Any]]) -> None:
    pm = copy.deepcopy(_one(objects, "PodMonitor"))
    pm["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pm, PODMONITOR_SCHEMA)
    rule = copy.deepcopy(_one(objects, "PrometheusRule"))
    rule["spec"]["groups"][1]["rules"][0]["for"] = "15 minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, PROMETHEUSRULE_SCHEMA)


def test_dashboard_configmap_fits_and_parses(objects: list[dict[str, Any]]) -> None:
    cm = _one(objects, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    assert len(text.encode()) < 1_000_000  # ConfigMap limit is 1 MiB
    assert json.loads(text)["uid"] == "zonemeter-overview"


# ---------------------------------------------------------------- cleanup


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_cleanup_daemonset_validates_and_only_cleans(version: str, objects: list[dict[str, Any]]) -> None:
    objs = render(DEPLOY / "cleanup")
    assert sorted(o["kind"] for o in objs) == ["DaemonSet", "Namespace"]
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)
    pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["--cleanup"]
    assert "command" not in init, "keep the image entrypoint (it skips header setup for --cleanup)"
    agent_sc = _agent_container(objects)["securityContext"]
    assert init["securityContext"]["capabilities"] == agent_sc["capabilities"]
    assert pod["automountServiceAccountToken"] is False and pod["hostNetwork"] is True
    (idle,) = pod["containers"]
    assert idle["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert idle["securityContext"]["runAsNonRoot"] is True
    # The same image as the agent, and the same bpffs mount.
    top = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["images"]
    assert yaml.safe_load((DEPLOY / "cleanup" / "kustomization.yaml").read_text())["images"] == top
    assert init["image"] == _agent_container(objects)["image"]
    bpffs = [m for m in init["volumeMounts"] if m["mountPath"] == "/sys/fs/bpf"]
    assert bpffs and bpffs[0]["mountPropagation"] == "HostToContainer"
    # and the checkpoint's directory, which --cleanup empties too
    volumes = {v["name"]: v for v in pod["volumes"]}
    state = [m for m in init["volumeMounts"] if m["mountPath"] == "/var/lib/zonemeter"]
    assert state and volumes[state[0]["name"]]["hostPath"]["path"] == "/var/lib/zonemeter"


# ---------------------------------------------------------------- real kustomize


def _kubectl_kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed: render() stands alone")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.mark.parametrize("sub", [".", "agent", "cleanup"])
def test_render_equals_kubectl_kustomize(sub: str) -> None:
    """Where kubectl is installed, the test renderer must agree with kustomize exactly."""
    assert _by_key(_kubectl_kustomize(DEPLOY / sub)) == _by_key(render(DEPLOY / sub))


@pytest.mark.parametrize("component", ["legacy-kernel", "cgroup-hook"])
def test_component_render_equals_kubectl_kustomize(tmp_path: Path, component: str) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(DEPLOY, overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/{component}]\n"
    )
    want = render(DEPLOY, components=(DEPLOY / "components" / component,))
    assert _by_key(_kubectl_kustomize(overlay)) == _by_key(want)


#: ports that node-level agents commonly bind with hostNetwork (deploy/daemonset/README.md,
#: Configuration): kubelet, kube-proxy, node-exporter, CSI livenessprobe, Calico Felix,
#: Cilium (agent, operator, Envoy, Hubble), NodeLocal DNSCache
NODE_AGENT_PORTS = {10248, 10249, 10250, 10255, 10256, 9100, 9808, 9091, 9962, 9963, 9964, 9965, 9253}


def test_the_metrics_port_is_clear_of_common_node_agents(objects: list[dict[str, Any]]) -> None:
    from agent.cli.agent import DEFAULT_METRICS_ADDRESS

    (port_spec,) = _agent_container(objects)["ports"]
    port = port_spec["containerPort"]
    assert DEFAULT_METRICS_ADDRESS.endswith(f":{port}")  # the manifest and the agent agree
    assert port not in NODE_AGENT_PORTS
    assert not 9100 <= port <= 9999  # Prometheus' exporter allocations (full)
    assert not 30000 <= port <= 60999  # NodePorts and the default ephemeral range
    assert not 15000 <= port <= 15090  # Istio


def test_a_resource_quota_admits_the_priority_class_outside_kube_system(objects: list[dict[str, Any]]) -> None:
    """GKE admits system-node-critical pods outside kube-system only under a ResourceQuota
    scoped to that PriorityClass (deploy/daemonset/agent/resourcequota.yaml)."""
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    prio = ds["spec"]["template"]["spec"]["priorityClassName"]
    (quota,) = [o for o in objects if o["kind"] == "ResourceQuota"]
    assert quota["metadata"]["namespace"] == ds["metadata"]["namespace"]
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert (expr["scopeName"], expr["operator"], expr["values"]) == ("PriorityClass", "In", [prio])
    assert set(quota["spec"]["hard"]) == {"pods"}  # admits; limits nothing else
