"""The real control plane (tools/kube/controlplane.py) in a network namespace of its own.

etcd, kube-apiserver and kube-controller-manager, built by tools/kube/build.sh, start inside
a fresh ``zmtest-`` namespace. The test plays the kubelet's part (Node and Pod status through
the status subresource, as kwok does) for three nodes in three zones and one Pod on each, and
checks that the real EndpointSlice controller, not the project's model, wrote a slice for a
``topology-mode: Auto`` Service with a ``forZones`` hint for every endpoint (the rule:
kube-controller-manager, staging/src/k8s.io/endpointslice/topologycache, TopologyCache.AddHints;
docs/hints.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tools.kube.controlplane import Binaries, ControlPlane

pytestmark = [pytest.mark.e2e]

ADDRESS = "10.250.0.10"
SERVICE_CIDR = "10.96.0.0/16"
NODES = {"node-a": "zone-a", "node-b": "zone-b", "node-c": "zone-c"}
POD_IPS = {"node-a": "10.244.1.10", "node-b": "10.244.2.10", "node-c": "10.244.3.10"}


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace with ADDRESS on its loopback; deleted afterwards."""
    if os.geteuid() != 0:
        pytest.fail("tests/e2e/test_controlplane.py needs root (it creates a network namespace)")
    name = f"zmtest-cp-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # the lab's kernels may lack the dummy link type; a /32 on lo is an address of the ns all the same
        for cmd in (["addr", "add", f"{ADDRESS}/32", "dev", "lo"], ["link", "set", "lo", "up"]):
            subprocess.run(["ip", "-n", name, *cmd], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _wait_json(cp: ControlPlane, args: list[str], done, timeout_s: float = 90.0):  # type: ignore[no-untyped-def]
    """Poll ``kubectl get ... -o json`` until ``done(obj)`` is true; return the object."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        p = cp.kubectl(*args, "-o", "json", check=False)
        if p.returncode == 0:
            last = json.loads(p.stdout)
            if done(last):
                return last
        time.sleep(0.5)
    raise AssertionError(f"kubectl {' '.join(args)}: condition not met in {timeout_s} s; last: {last}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_real_endpointslice_controller_writes_zone_hints(netns: str, tmp_path: Path) -> None:
    binaries = Binaries.find()  # fails (never skips) with the build command when not built
    with ControlPlane(netns, ADDRESS, SERVICE_CIDR, tmp_path / "cp", binaries=binaries) as cp:
        version = json.loads(cp.kubectl("version", "-o", "json").stdout)
        assert version["serverVersion"]["gitVersion"] == binaries.kube_version
        assert all(cp.running().values()), cp.running()

        # the kubernetes Service got the first address of the range, its endpoint the ns address
        svc = json.loads(cp.kubectl("get", "service", "kubernetes", "-n", "default", "-o", "json").stdout)
        assert svc["spec"]["clusterIP"] == "10.96.0.1"

        cp.kubectl("create", "namespace", "zm")
        # the real serviceaccount controller creates the namespace's default ServiceAccount,
        # which the ServiceAccount admission plugin needs before any Pod is admitted
        _wait_json(cp, ["get", "serviceaccount", "default", "-n", "zm"], lambda o: o["metadata"]["name"] == "default")

        for node, zone in NODES.items():
            cp.kubectl("apply", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {"topology.kubernetes.io/zone": zone,
                                                      "kubernetes.io/hostname": node}},
            }))
            cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "lab",
                                "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
            }}))

        cp.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "zm",
                         "annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }))
        for node, ip in POD_IPS.items():
            pod = f"web-{node}"
            cp.kubectl("apply", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": "zm", "labels": {"app": "web"}},
                "spec": {"nodeName": node, "containers": [{"name": "web", "image": "registry.invalid/web:1",
                                                           "ports": [{"containerPort": 8080}]}]},
            }))
            cp.kubectl("patch", "pod", pod, "-n", "zm", "--subresource=status", "--type=merge", "-p", json.dumps({
                "status": {
                    "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ADDRESS,
                    "startTime": _now(),
                    "conditions": [{"type": t, "status": "True", "lastTransitionTime": _now()}
                                   for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                }}))

        def hinted(o: dict) -> bool:  # type: ignore[type-arg]
            eps = [e for s in o["items"] for e in (s.get("endpoints") or [])]
            return len(eps) == 3 and all(e.get("hints") for e in eps)

        slices = _wait_json(cp, ["get", "endpointslices", "-n", "zm", "-l", "kubernetes.io/service-name=web"], hinted)
        assert len(slices["items"]) == 1
        s = slices["items"][0]
        assert s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "endpointslice-controller.k8s.io"
        assert s["addressType"] == "IPv4"
        assert [(p["name"], p["port"]) for p in s["ports"]] == [("http", 8080)]
        got = {e["addresses"][0]: (e["nodeName"], e["zone"], e["conditions"]["ready"], e["hints"])
               for e in s["endpoints"]}
        # one endpoint per zone, equal allocatable CPU: each zone is allotted its own endpoint
        assert got == {ip: (node, NODES[node], True, {"forZones": [{"name": NODES[node]}]})
                       for node, ip in POD_IPS.items()}
        assert all(cp.running().values()), cp.running()

        # a restarted kube-apiserver serves the same state from etcd
        before = cp.pids["kube-apiserver"]
        cp.restart("kube-apiserver")
        assert cp.pids["kube-apiserver"] != before and not Path(f"/proc/{before}").exists()
        again = json.loads(cp.kubectl("get", "endpointslices", "-n", "zm", "-l", "kubernetes.io/service-name=web",
                                      "-o", "json").stdout)
        assert [x["metadata"]["uid"] for x in again["items"]] == [s["metadata"]["uid"]]
        assert all(cp.running().values()), cp.running()
        pids = cp.pids
    assert sorted(pids) == ["etcd", "kube-apiserver", "kube-controller-manager"]
    # stop() terminated and reaped every component
    assert [n for n, pid in pids.items() if Path(f"/proc/{pid}").exists()] == []
