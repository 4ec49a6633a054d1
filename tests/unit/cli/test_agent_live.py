"""zonemeter agent --kubeconfig against a Kubernetes API served over real HTTP by kmock.

The agent's own ``_run`` (the CLI path minus signal handling) runs in a thread with the
fake datapath of test_agent.py; metadata comes from the real list+watch. Checks: /readyz
turns 200 once synced, the kernel endpoint set follows an EndpointSlice change made on
the API, bytes to the new endpoint are attributed to its Service, and the hint model runs at
the version the API server's ``/version`` reports (kmock answers it; the test sets its value).
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

from agent import cli
from agent.cli.agent import _run
from agent.records import FlowKind
from tests.fixtures.topologies import two_zone_cluster
from tests.unit.cli.test_agent import FakeDatapath, _free_port, d

pytestmark = pytest.mark.asyncio
ip = ipaddress.ip_address

RESOURCES = {"nodes": "v1/nodes", "pods": "v1/pods", "services": "v1/services",
             "endpointslices": "discovery.k8s.io/v1/endpointslices"}


class ThreadStopper:
    """Stands in for agent.cli.agent.Stopper outside the main thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal = None

    def wait(self, timeout: float) -> bool:
        return self.event.wait(max(0.0, timeout))


async def until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(cond):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def _metrics(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=1) as r:
            return r.read().decode()
    except OSError:
        return ""


async def test_live_metadata_drives_endpoints_and_attribution(
        kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.datapath

    c = two_zone_cluster()
    web_slice = c["endpointslices"][0]
    web_slice["endpoints"] = web_slice["endpoints"][:1]  # only web-a (na) at first
    for kind, res in RESOURCES.items():
        kmock.resources[res] = {}
        for obj in c[kind]:
            key = kmock_lib.resource(res), obj["metadata"].get("namespace"), obj["metadata"]["name"]
            kmock.objects[key] = obj

    # an EKS-style gitVersion. kmock answers GET /version itself (v1.26.4+k3s1) but not
    # /version/, the path the official client's VersionApi requests
    kmock["get /version/"] << {"major": "1", "minor": "33+", "gitVersion": "v1.33.5-eks-abc",
                              "platform": "linux/amd64"}
    made: list[FakeDatapath] = []
    monkeypatch.setattr(agent.datapath, "Datapath", lambda config: made.append(FakeDatapath(config)) or made[-1])  # type: ignore[func-returns-value]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: k, cluster: {{server: '{str(kmock.url).rstrip('/')}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\ncurrent-context: c\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    args = cli.build_parser().parse_args([
        "agent", "--node-name", "na", "--kubeconfig", str(kubeconfig),
        "--metrics-address", f"127.0.0.1:{port}", "--interval", "0.2"])
    stopper = ThreadStopper()
    task = asyncio.create_task(asyncio.to_thread(_run, args, stopper))  # type: ignore[arg-type]
    try:
        await until(lambda: _status(url + "/readyz") == 200)
        await until(lambda: bool(made and made[0].endpoints))
        dp = made[0]
        # attached only after the first list: the first set written is already the real one
        assert dp.endpoints == [frozenset({(ip("10.244.1.20"), 8080, 6)})]
        assert dp.events[0] == "watch"

        # a second web pod on na joins the slice: the kernel's endpoint set follows
        new_pod = two_zone_cluster()["pods"][2]
        new_pod["metadata"]["name"] = "web-a2"
        new_pod["metadata"]["uid"] = "uid-web-a2"
        new_pod["status"]["podIP"] = "10.244.1.21"
        new_pod["status"]["podIPs"] = [{"ip": "10.244.1.21"}]
        await kmock.post("/api/v1/namespaces/shop/pods", json=new_pod)
        eps = two_zone_cluster()["endpointslices"][0]["endpoints"]
        eps[1] = {**eps[0], "addresses": ["10.244.1.21"]}
        await kmock.patch("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-abcde",
                          json={"endpoints": eps})
        want = frozenset({(ip("10.244.1.20"), 8080, 6), (ip("10.244.1.21"), 8080, 6)})
        await until(lambda: dp.endpoints[-1] == want)

        dp.pending = [d(FlowKind.REQUEST, "10.244.1.21", "10.244.2.10", 8080, 321)]
        line = ('zonemeter_service_bytes_total{client_kind="pod",client_zone="zone-b",crossing="cross_zone",'
                'direction="request",lb_type="none",namespace="shop",port="80",server_zone="zone-a",'
                'service="web"} 321.0')
        await until(lambda: line in _metrics(url))
        assert 'zonemeter_metadata_synced{resource="endpointslices"} 1.0' in _metrics(url)
        assert ('zonemeter_hint_model_info{kube_proxy_source="default",kube_proxy_version="1.33",'
                'kubernetes_version="1.33",source="cluster"} 1.0') in _metrics(url)
    finally:
        stopper.event.set()
        rc = await asyncio.wait_for(task, 30)
    assert rc == 0
    ev = made[0].events
    first_close = ev.index("close")  # detach, then the final drain, then nothing counts
    assert ev[first_close + 1] == "drain" and "drain" not in ev[first_close + 2:]
