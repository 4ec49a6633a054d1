"""deploy/daemonset applied to a real kube-apiserver (tools/kube/controlplane.py, built from its
Go module by tools/kube/build.sh), in a network namespace of its own.

* ``kubectl apply -k`` of the agent and of the cleanup kustomizations succeeds, and so does
  a ``--dry-run=server`` apply of each afterwards (the server's validation, defaulting and
  admission; before the namespace exists a server dry run refuses the objects in it);
* PodSecurity admission (on by default in kube-apiserver) admits a Pod made from each
  DaemonSet's template in its namespace, and refuses the same Pod where the namespace
  enforces ``baseline``, so the namespace labels are what admits it;
* the agent with ``components/cgroup-hook`` (the host's cgroup2 root as a hostPath) applies
  and is admitted alike;
* the agent's ServiceAccount, with a token the server issued (TokenRequest), may get, list
  and watch exactly pods, nodes, services and endpointslices (the SelfSubjectRulesReview
  behind ``kubectl auth can-i --list``, and ``kubectl auth can-i`` probes)
  and nothing else beyond what every authenticated user may do.

* with the Prometheus Operator's PodMonitor and PrometheusRule CRDs installed (fetched from
  the operator's Go module by tools/kube/build.sh), the whole ``deploy/daemonset``
  kustomization, monitoring included, applies and validates against them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.controlplane import control_plane, install_operator_crds
from tools.kube.controlplane import Binaries, ControlPlane

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "daemonset"
ADDRESS = "10.250.0.11"
SA = "system:serviceaccount:zonemeter:zonemeter-agent"
#: what the agent reads (docs/security.md): get, list and watch of these four, nothing more
AGENT_RULES = {(r, v) for r in ("pods", "nodes", "services", "endpointslices.discovery.k8s.io")
               for v in ("get", "list", "watch")}
#: some of what every authenticated identity may do (kube-apiserver's bootstrap policy,
#: system:basic-user); the test reads the whole set from an unbound service account
EVERYONE = {"selfsubjectaccessreviews.authorization.k8s.io", "selfsubjectrulesreviews.authorization.k8s.io",
            "selfsubjectreviews.authentication.k8s.io"}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane("dp", ADDRESS, tmp_path_factory.mktemp("cp")) as plane:
        yield plane



def test_whole_kustomization_with_the_prometheus_operator_crds(cp: ControlPlane) -> None:
    install_operator_crds(cp)
    done = cp.kubectl("apply", "-k", str(DEPLOY), check=False)
    assert done.returncode == 0, done.stderr
    dry = cp.kubectl("apply", "--dry-run=server", "-k", str(DEPLOY), check=False)
    assert dry.returncode == 0, dry.stderr
    kinds = {o["kind"] for o in _rendered(DEPLOY)}
    assert {"PodMonitor", "PrometheusRule", "DaemonSet"} <= kinds
    for kind in ("podmonitor", "prometheusrule"):
        got = json.loads(cp.kubectl("get", kind, "-n", "zonemeter", "-o", "json").stdout)["items"]
        assert len(got) == 1, (kind, got)
    # the CRD's schema is enforced: a PodMonitor with a misspelt field is refused
    pm = next(o for o in _rendered(DEPLOY) if o["kind"] == "PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    bad = cp.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(pm),
                     check=False)
    assert bad.returncode != 0 and "intervall" in bad.stderr, bad.stderr


def _rendered(directory: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(subprocess.run(
        [str(Binaries.find().kubectl), "kustomize", str(directory)], capture_output=True, text=True,
        check=True).stdout) if d]


def _pod_from(ds: dict[str, Any], namespace: str) -> dict[str, Any]:
    tmpl = ds["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": ds["metadata"]["name"] + "-psa", "namespace": namespace,
                         "labels": tmpl["metadata"].get("labels", {})},
            "spec": tmpl["spec"]}


@pytest.mark.parametrize("kustomization", ["agent", "cleanup"])
def test_kustomization_applies_and_pod_security_admits_its_pods(cp: ControlPlane, kustomization: str) -> None:
    directory = DEPLOY / kustomization
    done = cp.kubectl("apply", "-k", str(directory), check=False)
    assert done.returncode == 0, done.stderr
    # once the namespace exists (a server dry run cannot create it for the objects in it):
    # the server's validation, defaulting and admission of every object again
    dry = cp.kubectl("apply", "--dry-run=server", "-k", str(directory), check=False)
    assert dry.returncode == 0, dry.stderr
    objs = _rendered(directory)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for kind, name in kinds:
        ns = next(o["metadata"].get("namespace") for o in objs if (o["kind"], o["metadata"]["name"]) == (kind, name))
        got = cp.kubectl("get", kind, name, *(["-n", ns] if ns else []), "-o", "json", check=False)
        assert got.returncode == 0, f"{kind}/{name} not on the server: {got.stderr}"
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    ns = ds["metadata"]["namespace"]
    pod = _pod_from(ds, ns)
    admitted = cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert admitted.returncode == 0, admitted.stderr
    # the same Pod where baseline is enforced: refused, so the namespace's labels admit it
    strict = f"zmpsa-{kustomization}"
    cp.kubectl("create", "namespace", strict, check=False)
    cp.kubectl("label", "--overwrite", "namespace", strict, "pod-security.kubernetes.io/enforce=baseline")
    if pod["spec"].get("serviceAccountName"):  # so only PodSecurity can refuse it
        cp.kubectl("create", "serviceaccount", pod["spec"]["serviceAccountName"], "-n", strict, check=False)
    pod["metadata"]["namespace"] = strict
    refused = cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr
    assert "hostNetwork" in refused.stderr or "host namespaces" in refused.stderr, refused.stderr


def test_the_cgroup_hook_component_applies_and_pod_security_admits_it(cp: ControlPlane, tmp_path: Path) -> None:
    """The agent with components/cgroup-hook (a hostPath of the host's /sys/fs/cgroup):
    the server stores it as rendered, and the privileged namespace admits its pod."""
    import os

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(DEPLOY, overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{rel}/agent]\ncomponents: [{rel}/components/cgroup-hook]\n")
    done = cp.kubectl("apply", "-k", str(overlay), check=False)
    assert done.returncode == 0, done.stderr
    stored = json.loads(cp.kubectl("get", "daemonset", "zonemeter-agent", "-n", "zonemeter", "-o",
                                   "json").stdout)
    spec = stored["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["args"][-2:] == ["--hook=cgroup", "--cgroup-root=/run/zonemeter/cgroupv2"]
    assert {"name": "host-cgroup", "mountPath": "/run/zonemeter/cgroupv2", "readOnly": True} in c["volumeMounts"]
    assert {"name": "host-cgroup", "hostPath": {"path": "/sys/fs/cgroup", "type": "Directory"}} in spec["volumes"]
    (ds,) = [o for o in _rendered(overlay) if o["kind"] == "DaemonSet"]
    admitted = cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(_pod_from(ds, "zonemeter")),
                          check=False)
    assert admitted.returncode == 0, admitted.stderr
    # put the plain agent back for the tests that follow
    back = cp.kubectl("apply", "-k", str(DEPLOY / "agent"), check=False)
    assert back.returncode == 0, back.stderr


def _token_kubeconfig(cp: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig holding a token the server issued (TokenRequest) for ``account``."""
    token = cp.kubectl("create", "token", account, "-n", namespace).stdout.strip()
    assert token.count(".") == 2  # a JWT the server signed
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "lab", "cluster": {"server": cp.server,
                                                 "certificate-authority": str(cp.pki / "ca.crt")}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "lab", "user": "sa"}}]}))
    return path


def _allowed(cp: ControlPlane, kc: Path) -> set[tuple[str, str]]:
    """(resource[.group], verb) pairs the identity of ``kc`` may use in namespace zonemeter,
    cluster-wide rules included: the SelfSubjectRulesReview behind ``kubectl auth can-i
    --list`` (which prints only a table)."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
              "spec": {"namespace": "zonemeter"}}
    # client-side validation would list CRDs, which these identities may not: --validate=false
    got = cp.kubectl("--kubeconfig", str(kc), "create", "--validate=false", "-o", "json", "-f", "-",
                     input=json.dumps(review), check=False)
    assert got.returncode == 0, got.stderr
    allowed: set[tuple[str, str]] = set()
    for r in json.loads(got.stdout)["status"]["resourceRules"]:
        for group in r.get("apiGroups") or [""]:
            for res in r.get("resources", []):
                for verb in r["verbs"]:
                    allowed.add((res if group == "" else f"{res}.{group}", verb))
    return allowed


def test_the_agent_token_reads_exactly_four_kinds(cp: ControlPlane, tmp_path: Path) -> None:
    cp.kubectl("apply", "-k", str(DEPLOY / "agent"))
    kc = _token_kubeconfig(cp, "zonemeter", "zonemeter-agent", tmp_path / "agent.kubeconfig")
    who = cp.kubectl("--kubeconfig", str(kc), "auth", "whoami", "-o", "json")
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == SA
    # what any service account may do without a binding (kube-apiserver's bootstrap policy for
    # system:authenticated: self reviews, public info, ClusterTrustBundles in 1.37 ...)
    cp.kubectl("create", "serviceaccount", "zm-nobody", "-n", "default", check=False)
    baseline = _allowed(cp, _token_kubeconfig(cp, "default", "zm-nobody", tmp_path / "nobody.kubeconfig"))
    assert {r for r, _ in baseline} >= EVERYONE
    assert _allowed(cp, kc) - baseline == AGENT_RULES
    # and probes of what it must not do, as the server judges them
    for verb, res in (("create", "pods"), ("get", "secrets"), ("list", "configmaps"), ("delete", "nodes"),
                      ("watch", "events"), ("patch", "endpointslices.discovery.k8s.io")):
        no = cp.kubectl("--kubeconfig", str(kc), "auth", "can-i", verb, res, "-A", check=False)
        assert no.stdout.strip() == "no", (verb, res, no.stdout, no.stderr)
    yes = cp.kubectl("--kubeconfig", str(kc), "auth", "can-i", "watch", "endpointslices.discovery.k8s.io",
                     "-A", check=False)
    assert yes.stdout.strip() == "yes", yes.stderr
