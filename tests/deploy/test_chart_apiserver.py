"""deploy/daemonset/chart installed with the real helm (v3.22.0, tools/kube/build.sh) into a real
kube-apiserver (tools/kube/controlplane.py) in a network namespace of its own, as
deploy/daemonset/README.md ("Helm") says:

* the namespace is created and labelled with the README's commands (the labels are the
  kustomization's Namespace's), the Prometheus Operator CRDs are installed, then
  ``helm install`` succeeds and puts every object ``helm template`` renders on the server,
  and PodSecurity admits a Pod made from the DaemonSet's template there;
* ``helm install`` with createNamespace=true cannot create the release's own namespace
  (helm stores its release there first), which is why the chart leaves it to the user;
* ``helm upgrade`` with changed values changes the DaemonSet in place (same object, rolling
  update with maxSurge 0 kept; a zone-CIDR ConfigMap added) and monitoring.enabled=false
  deletes the PodMonitor and PrometheusRule;
* ``helm uninstall`` removes every object of the chart, cluster-scoped ones included, and
  leaves the namespace, where the cleanup kustomization then applies.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.controlplane import control_plane, install_operator_crds
from tests.fixtures.monitoring import load_script
from tools.kube.controlplane import ControlPlane

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "daemonset"
CHART = DEPLOY / "chart"
README = DEPLOY / "README.md"
ADDRESS = "10.250.0.12"

gen = load_script(CHART / "generate.py")


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane("ch", ADDRESS, tmp_path_factory.mktemp("cp")) as plane:
        yield plane


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


def helm(cp: ControlPlane, home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The cached helm inside the control plane's namespace with its admin kubeconfig."""
    try:
        binary = gen.find_helm()
    except gen.GenerateError as err:
        pytest.fail(str(err))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home)}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    p = subprocess.run(["ip", "netns", "exec", cp.netns, str(binary), "--kubeconfig", str(cp.kubeconfig), *args],
                       capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert p.returncode == 0, f"helm {' '.join(args)}: {p.stderr}"
    return p


def _readme_commands(marker: str) -> list[list[str]]:
    """The ``kubectl`` lines of the README's Helm section that follow the line holding
    ``marker`` up to the next blank line, split as the shell would (comments dropped)."""
    text = README.read_text()
    section = text[text.index("\n## Helm\n"):]
    section = section[:section.index("\n## ", 1)]
    lines = section[section.index(marker):].splitlines()[1:]
    out = []
    for line in lines:
        if not line.strip():
            break
        words = shlex.split(line, comments=True)
        if words and words[0] == "kubectl":  # repository paths as from its root
            out.append([str(ROOT / w) if w.startswith("deploy/") else w for w in words[1:]])
    assert out, f"README.md, Helm: no kubectl commands after {marker!r}"
    return out


def _on_server(cp: ControlPlane, objs: list[dict[str, Any]]) -> dict[tuple[str, str], bool]:
    found = {}
    for o in objs:
        ns = o["metadata"].get("namespace")
        got = cp.kubectl("get", o["kind"], o["metadata"]["name"], *(["-n", ns] if ns else []), "-o", "name",
                         check=False)
        found[(o["kind"], o["metadata"]["name"])] = got.returncode == 0
    return found


def _daemonset(cp: ControlPlane) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", "daemonset", "zonemeter-agent", "-n", "zonemeter", "-o", "json").stdout)  # type: ignore[no-any-return]


def test_install_upgrade_uninstall(cp: ControlPlane, helm_home: Path, tmp_path: Path) -> None:
    install_operator_crds(cp)

    # createNamespace=true cannot work with helm install: the release record goes first
    no_ns = helm(cp, helm_home, "install", "zm-no-ns", str(CHART), "--namespace", "zm-absent",
                 "--set", "createNamespace=true", check=False)
    assert no_ns.returncode != 0 and "not found" in no_ns.stderr, no_ns.stderr

    # the README's namespace commands give the kustomization's Namespace labels
    for cmd in _readme_commands("<!-- helm: namespace -->"):
        cp.kubectl(*cmd)
    kust = gen.kustomize(str(cp.binaries.kubectl))
    (want_ns,) = [o for o in kust if o["kind"] == "Namespace"]
    ns = json.loads(cp.kubectl("get", "namespace", "zonemeter", "-o", "json").stdout)
    psa = {k: v for k, v in want_ns["metadata"]["labels"].items() if k.startswith("pod-security.")}
    assert psa and {k: ns["metadata"]["labels"].get(k) for k in psa} == psa

    # install
    done = helm(cp, helm_home, "install", "zonemeter", str(CHART), "--namespace", "zonemeter")
    assert "STATUS: deployed" in done.stdout, done.stdout
    rendered = [d for d in yaml.safe_load_all(helm(cp, helm_home, "get", "manifest", "zonemeter", "-n",
                                                        "zonemeter").stdout) if d]
    assert {o["kind"] for o in rendered} == {o["kind"] for o in kust} - {"Namespace"}
    assert all(_on_server(cp, rendered).values()), _on_server(cp, rendered)
    ds = _daemonset(cp)
    assert ds["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "zonemeter-psa", "namespace": "zonemeter",
                        "labels": ds["spec"]["template"]["metadata"]["labels"]},
           "spec": ds["spec"]["template"]["spec"]}
    admitted = cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert admitted.returncode == 0, admitted.stderr

    # upgrade: new values, the same DaemonSet updated in place with its rolling update
    uid, generation = ds["metadata"]["uid"], ds["metadata"]["generation"]
    cidrs = tmp_path / "zones.csv"
    cidrs.write_text("cidr,zone,region\n10.20.0.0/16,us-east-1a,us-east-1\n")
    up = helm(cp, helm_home, "upgrade", "zonemeter", str(CHART), "--namespace", "zonemeter",
              "--set", "attach=clsact", "--set", "interval=5", "--set-file", f"zoneCidrs={cidrs}")
    assert "REVISION: 2" in up.stdout, up.stdout
    ds = _daemonset(cp)
    assert ds["metadata"]["uid"] == uid and ds["metadata"]["generation"] == generation + 1
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert {"--attach=clsact", "--interval=5", "--zone-cidrs=/etc/zonemeter/zone-cidrs/zone-cidrs"} <= set(c["args"])
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "10%"}}
    cm = json.loads(cp.kubectl("get", "configmap", "zonemeter-zone-cidrs", "-n", "zonemeter", "-o", "json").stdout)
    assert cm["data"] == {"zone-cidrs": cidrs.read_text()}
    # --reuse-values keeps revision 2's values; monitoring off deletes the operator objects
    helm(cp, helm_home, "upgrade", "zonemeter", str(CHART), "--namespace", "zonemeter", "--reuse-values",
         "--set", "monitoring.enabled=false")
    for kind in ("podmonitor", "prometheusrule"):
        assert json.loads(cp.kubectl("get", kind, "-n", "zonemeter", "-o", "json").stdout)["items"] == [], kind
    assert "--attach=clsact" in _daemonset(cp)["spec"]["template"]["spec"]["containers"][0]["args"]

    # uninstall: every object of the chart goes, the namespace stays for the cleanup
    gone = helm(cp, helm_home, "uninstall", "zonemeter", "--namespace", "zonemeter", "--wait", "--timeout", "2m")
    assert "uninstalled" in gone.stdout, gone.stdout
    assert not any(_on_server(cp, rendered).values()), _on_server(cp, rendered)
    assert helm(cp, helm_home, "list", "-A", "-q").stdout.strip() == ""
    assert cp.kubectl("get", "namespace", "zonemeter", check=False).returncode == 0
    for cmd in _readme_commands("<!-- helm: cleanup -->"):
        if cmd[:1] == ["apply"]:
            done2 = cp.kubectl(*cmd, check=False)
            assert done2.returncode == 0, done2.stderr
