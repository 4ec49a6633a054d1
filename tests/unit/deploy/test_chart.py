"""deploy/daemonset/chart: the Helm chart generated from the kustomization, checked with real helm.

* the committed chart is exactly what deploy/daemonset/chart/generate.py writes from
  ``kubectl kustomize deploy/daemonset`` (so it is never a second hand-kept copy);
* ``helm lint --strict`` passes (helm v3.22.0 from its Go module, tools/kube/build.sh);
* ``helm template`` with the default values gives the kustomize output object for object
  (parsed YAML), apart from Helm's own labels and the Namespace, which the chart templates
  only with createNamespace=true (then nothing differs);
* every value changes what it should and nothing else.

kubectl and helm are the binaries tools/kube/build.sh caches; missing, the tests fail with
the build command (never skip).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.k8s.cidrs import load_zone_cidrs
from tests.fixtures.monitoring import load_script
from tools.kube.controlplane import Binaries, ControlPlaneError

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "daemonset"
CHART = DEPLOY / "chart"
#: labels Helm charts conventionally add (Helm's own); the only difference from kustomize
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}


gen = load_script(CHART / "generate.py")


def _kubectl() -> str:
    try:
        return str(Binaries.find().kubectl)
    except ControlPlaneError as err:
        pytest.fail(str(err))


def _helm() -> Path:
    try:
        return gen.find_helm()  # type: ignore[no-any-return]
    except gen.GenerateError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def kustomized() -> list[dict[str, Any]]:
    return gen.kustomize(_kubectl())  # type: ignore[no-any-return]


def helm(*args: str, tmp: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the cached helm with its config, cache and data homes under ``tmp``."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp)}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp / var.lower())
    p = subprocess.run([str(_helm()), *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert p.returncode == 0, f"helm {' '.join(args)}: {p.stderr}"
    return p


def template(tmp: Path, *sets: str, namespace: str = "zonemeter", values: dict[str, Any] | None = None
             ) -> list[dict[str, Any]]:
    """Objects of ``helm template zonemeter CHART --namespace NS --set ...`` (and -f values)."""
    extra: list[str] = []
    for s in sets:
        extra += ["--set", s]
    if values is not None:
        vf = tmp / "values.override.yaml"
        vf.write_text(yaml.safe_dump(values))
        extra += ["-f", str(vf)]
    out = helm("template", "zonemeter", str(CHART), "--namespace", namespace, *extra, tmp=tmp).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _key(o: dict[str, Any]) -> tuple[str, str]:
    return o["kind"], o["metadata"]["name"]


def without_helm_labels(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name) with Helm's own labels removed (asserting each object has them)."""
    out = {}
    for o in copy.deepcopy(objs):
        labels = o["metadata"]["labels"]
        assert HELM_LABELS <= set(labels), (_key(o), labels)
        for label in HELM_LABELS:
            del labels[label]
        out[_key(o)] = o
    return out


def _container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


# -- one source of truth -------------------------------------------------------------------
def test_committed_chart_is_the_generators_output(kustomized: list[dict[str, Any]]) -> None:
    files = gen.render(kustomized)
    assert gen.stale(files) == [], "deploy/daemonset/chart is stale: python deploy/daemonset/chart/generate.py"
    assert gen.main(["--check", "--kubectl", _kubectl()]) == 0


def test_check_fails_on_a_hand_edit(kustomized: list[dict[str, Any]], tmp_path: Path) -> None:
    files = gen.render(kustomized)
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert gen.stale(files, tmp_path) == []
    values = tmp_path / "values.yaml"
    values.write_text(values.read_text().replace("interval: 10", "interval: 15"))
    (tmp_path / "templates" / "extra.yaml").write_text("kind: ConfigMap\n")
    assert gen.stale(files, tmp_path) == ["values.yaml", "templates/extra.yaml"]


def test_a_kustomize_change_reaches_the_chart(kustomized: list[dict[str, Any]]) -> None:
    changed = copy.deepcopy(kustomized)
    c = _container(changed)
    c["args"] = ["--metrics-address=0.0.0.0:9999", "--interval=30"]
    c["resources"]["limits"]["memory"] = "1Gi"
    files = gen.render(changed)
    assert '"--metrics-address=0.0.0.0:9999"' in files["templates/daemonset.yaml"]
    values = yaml.safe_load(files["values.yaml"])
    assert values["interval"] == 30 and values["resources"]["limits"]["memory"] == "1Gi"


@pytest.mark.parametrize("breakage, message", [
    (lambda c, objs: c["args"].append("--attach=tcx"), "args: --attach is a chart value"),
    (lambda c, objs: c["args"].remove("--interval=10"), "want one --interval=S"),
    (lambda c, objs: c.update(image="zonemeter@sha256:00"), "image: want NAME:TAG"),
    (lambda c, objs: objs.append({"kind": "Secret", "metadata": {"name": "x"}}), "Secret x: no chart template"),
])
def test_generator_names_what_it_cannot_carry(kustomized: list[dict[str, Any]], breakage: Any,
                                              message: str) -> None:
    objs = copy.deepcopy(kustomized)
    breakage(_container(objs), objs)
    with pytest.raises(gen.GenerateError, match=message):
        gen.render(objs)


# -- real helm -----------------------------------------------------------------------------
def test_helm_lint(tmp_path: Path) -> None:
    done = helm("lint", "--strict", str(CHART), tmp=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout, done.stdout
    for sets in (["attach=clsact", "zoneCidrs=10.0.0.0/8\\,zone-a", "monitoring.enabled=false"],
                 ["createNamespace=true", "extraArgs[0]=--log-level=debug"]):
        helm("lint", "--strict", str(CHART), *[a for s in sets for a in ("--set", s)], tmp=tmp_path)


def test_lint_refuses_a_bad_value(tmp_path: Path) -> None:
    bad = helm("lint", "--strict", str(CHART), "--set", "attach=xdp", tmp=tmp_path, check=False)
    assert bad.returncode != 0 and "attach" in bad.stdout + bad.stderr, bad.stdout + bad.stderr


def test_default_template_equals_kustomize(kustomized: list[dict[str, Any]], tmp_path: Path) -> None:
    want = {_key(o): o for o in kustomized}
    got = without_helm_labels(template(tmp_path))
    # helm install keeps its release in the namespace, so the chart leaves the Namespace to
    # the user by default (deploy/daemonset/README.md, Helm) ...
    assert set(want) - set(got) == {("Namespace", "zonemeter")}
    assert set(got) - set(want) == set()
    for k, obj in got.items():
        assert obj == want[k], k
    # ... and with createNamespace=true nothing at all differs
    assert without_helm_labels(template(tmp_path, "createNamespace=true")) == want


def test_helm_labels_stay_out_of_selectors_and_pods(tmp_path: Path) -> None:
    objs = template(tmp_path)
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    assert not HELM_LABELS & set(ds["spec"]["selector"]["matchLabels"])
    assert not HELM_LABELS & set(ds["spec"]["template"]["metadata"]["labels"])
    labels = ds["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "Helm" and labels["app.kubernetes.io/instance"] == "zonemeter"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert labels["helm.sh/chart"] == f"zonemeter-{chart['version']}"


def _changed(base: list[dict[str, Any]], got: list[dict[str, Any]]) -> set[tuple[str, str]]:
    b, g = {_key(o): o for o in base}, {_key(o): o for o in got}
    return {k for k in b.keys() | g.keys() if b.get(k) != g.get(k)}


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return template(tmp_path_factory.mktemp("helm"))


@pytest.mark.parametrize("mode", ["clsact", "tcx"])
def test_attach_adds_the_agent_argument(defaults: list[dict[str, Any]], tmp_path: Path, mode: str) -> None:
    assert not any(a.startswith("--attach") for a in _container(defaults)["args"])  # auto: the agent's default
    got = template(tmp_path, f"attach={mode}")
    assert _container(got)["args"] == [*_container(defaults)["args"], f"--attach={mode}"]
    assert _changed(defaults, got) == {("DaemonSet", "zonemeter-agent")}


def test_hook_cgroup_equals_the_cgroup_hook_component(kustomized: list[dict[str, Any]], tmp_path: Path) -> None:
    """hook=cgroup renders what components/cgroup-hook does to the kustomization."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(DEPLOY, overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/cgroup-hook]\n")
    want = {_key(o): o for o in gen.kustomize(_kubectl(), overlay)}
    got = without_helm_labels(template(tmp_path, "hook=cgroup", "createNamespace=true"))
    assert got == want
    assert _changed(kustomized, list(want.values())) == {("DaemonSet", "zonemeter-agent")}


def test_hook_auto_mounts_the_root_too_and_veth_is_the_default(defaults: list[dict[str, Any]],
                                                                tmp_path: Path) -> None:
    assert not any(a.startswith(("--hook", "--cgroup-root")) for a in _container(defaults)["args"])
    assert "host-cgroup" not in {m["name"] for m in _container(defaults)["volumeMounts"]}
    cg, auto = template(tmp_path, "hook=cgroup"), template(tmp_path, "hook=auto")
    assert _container(auto)["args"] == [a.replace("--hook=cgroup", "--hook=auto") for a in _container(cg)["args"]]
    assert _container(auto)["volumeMounts"] == _container(cg)["volumeMounts"]
    bad = helm("template", "x", str(CHART), "--set", "hook=netkit", tmp=tmp_path, check=False)
    assert bad.returncode != 0 and "hook" in bad.stderr, bad.stderr


def test_interval(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    assert "--interval=10" in _container(defaults)["args"]
    # --set makes integers numbers and 2.5 a string (the schema refuses it): fractions via -f
    for got, arg in ((template(tmp_path, "interval=5"), "--interval=5"),
                     (template(tmp_path, values={"interval": 2.5}), "--interval=2.5")):
        args = _container(got)["args"]
        assert arg in args and "--interval=10" not in args, args
    bad = helm("template", "x", str(CHART), "--set", "interval=0", tmp=tmp_path, check=False)
    assert bad.returncode != 0 and "interval" in bad.stderr, bad.stderr


def test_image_values(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    assert (_container(defaults)["image"], _container(defaults)["imagePullPolicy"]) == ("zonemeter:0.1.0",
                                                                                      "IfNotPresent")
    got = template(tmp_path, "image.repository=registry.example/ops/zonemeter", "image.tag=0.2.0",
                   "image.pullPolicy=Always")
    c = _container(got)
    assert (c["image"], c["imagePullPolicy"]) == ("registry.example/ops/zonemeter:0.2.0", "Always")
    assert _changed(defaults, got) == {("DaemonSet", "zonemeter-agent")}


def test_resources_tolerations_node_selector(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    values = {"resources": {"requests": {"cpu": "200m", "memory": "400Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
              "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "net", "effect": "NoSchedule"}],
              "nodeSelector": {"kubernetes.io/os": "linux", "zonemeter.example/enabled": "true"}}
    got = template(tmp_path, values=values)
    (ds,) = [o for o in got if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert _container(got)["resources"] == values["resources"]
    assert spec["tolerations"] == values["tolerations"]
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert _changed(defaults, got) == {("DaemonSet", "zonemeter-agent")}


def test_zone_cidrs_file(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    text = "cidr,zone,region\n10.20.0.0/16,us-east-1a,us-east-1\n2600:1f18:abcd:1::/64,us-east-1b,us-east-1\n"
    got = template(tmp_path, values={"zoneCidrs": text})
    (cm,) = [o for o in got if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "zonemeter-zone-cidrs"]
    assert cm["metadata"]["namespace"] == "zonemeter" and cm["data"] == {"zone-cidrs": text}
    c = _container(got)
    assert "--zone-cidrs=/etc/zonemeter/zone-cidrs/zone-cidrs" in c["args"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "zone-cidrs"]
    assert mount == {"name": "zone-cidrs", "mountPath": "/etc/zonemeter/zone-cidrs", "readOnly": True}
    (ds,) = [o for o in got if o["kind"] == "DaemonSet"]
    (vol,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "zone-cidrs"]
    assert vol["configMap"] == {"name": "zonemeter-zone-cidrs"}
    # a changed file rolls the pods: the template's checksum annotation follows the text
    ann = ds["spec"]["template"]["metadata"]["annotations"]["checksum/zone-cidrs"]
    other = template(tmp_path, values={"zoneCidrs": text + "10.30.0.0/16,us-east-1c\n"})
    (ds2,) = [o for o in other if o["kind"] == "DaemonSet"]
    assert ds2["spec"]["template"]["metadata"]["annotations"]["checksum/zone-cidrs"] != ann
    # the file as mounted is one the agent reads
    (tmp_path / "zone-cidrs").write_text(cm["data"]["zone-cidrs"])
    assert [z.zone for z in load_zone_cidrs(tmp_path / "zone-cidrs")] == ["us-east-1a", "us-east-1b"]
    assert _changed(defaults, got) == {("DaemonSet", "zonemeter-agent"), ("ConfigMap", "zonemeter-zone-cidrs")}


def test_monitoring_off_drops_the_operator_objects(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    got = template(tmp_path, "monitoring.enabled=false")
    assert {k for k in _changed(defaults, got)} == {("PodMonitor", "zonemeter-agent"),
                                                   ("PrometheusRule", "zonemeter")}
    assert not {"PodMonitor", "PrometheusRule"} & {o["kind"] for o in got}
    no_dash = template(tmp_path, "grafanaDashboard.enabled=false")
    assert _changed(defaults, no_dash) == {("ConfigMap", "zonemeter-grafana-dashboard")}


def test_extra_args_are_appended_verbatim(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    extra = ["--log-level=debug", "--flow-capacity=131072", "--exclude-interfaces=eth*,veth-up"]
    got = template(tmp_path, "attach=tcx", values={"extraArgs": extra})
    assert _container(got)["args"] == [*_container(defaults)["args"], "--attach=tcx", *extra]


def test_release_namespace(tmp_path: Path) -> None:
    got = template(tmp_path, "createNamespace=true", namespace="netobs")
    for o in got:
        if o["kind"] == "Namespace":
            assert o["metadata"]["name"] == "netobs"
        elif o["kind"] not in {"ClusterRole", "ClusterRoleBinding"}:
            assert o["metadata"]["namespace"] == "netobs", _key(o)
    (crb,) = [o for o in got if o["kind"] == "ClusterRoleBinding"]
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "zonemeter-agent", "namespace": "netobs"}]


def test_rule_and_dashboard_templates_survive_helm(defaults: list[dict[str, Any]]) -> None:
    # the alerts' {{ $labels.x }} and the dashboard's legends are Helm syntax too: escaped
    (rule,) = [o for o in defaults if o["kind"] == "PrometheusRule"]
    assert "{{ $labels" in json.dumps(rule)
    (cm,) = [o for o in defaults if o["kind"] == "ConfigMap"]
    json.loads(cm["data"]["zonemeter.json"])
