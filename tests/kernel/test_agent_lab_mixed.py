"""A cluster on two hooks, end to end: one real agent on the veth hook (a1), one on the
cgroup hook (b1). What the docs say happens (docs/datapath.md, "A cluster on two hooks")
happens, byte for byte against the nftables ground truth, and ZonemeterHookMixed fires on
what the two agents export.

Lab (tools/lab, flat): nodes a1 (zone-a) and b1 (zone-b), a client pod on each.

* ``shop/web``: a pod endpoint web-a1. Pod-to-pod Service traffic: exact whatever the mix.
* ``shop/hweb``: one host-network endpoint hweb-hb1 on the cgroup node b1, called from
  client-a1 on the veth node: counted **twice** (a1's veth counts a call to a Service
  whose endpoints are all host-network at the client; b1 counts it at the server's socket).
* ``shop/hdb``: one host-network endpoint hdb-ha1 on the veth node a1, called from
  client-b1 on the cgroup node: **lost** (b1 skips its client copy, as a cgroup node
  does; a1's veth hook has no veth to see a host-network server).

The unit test ``test_a_cluster_on_two_hooks_doubles_or_loses_exactly_the_listed_bytes``
(tests/unit/attribution/test_join.py) covers every other scenario through the kernel model.
"""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.kernel.test_agent_lab import INTERVAL, Agents
from tests.unit.deploy.test_rules import MON, _promtool

pytestmark = pytest.mark.kernel

TOPOLOGY = """\
options: {mode: flat, ipv6: false}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: client-a1, namespace: shop, node: a1, app: client}
  - {name: client-b1, namespace: shop, node: b1, app: client}
  - name: web-a1
    namespace: shop
    node: a1
    app: web
    ports: [{port: 8080, name: http}]
  - name: hweb-hb1
    namespace: shop
    node: b1
    app: hweb
    hostNetwork: true
    ports: [{port: 8080, name: http}]
  - name: hdb-ha1
    namespace: shop
    node: a1
    app: hdb
    hostNetwork: true
    ports: [{port: 9090, name: db}]
services:
  - name: web
    namespace: shop
    selector: {app: web}
    ports:
      - {name: http, port: 80, targetPort: http}
  - name: hweb
    namespace: shop
    selector: {app: hweb}
    ports:
      - {name: http, port: 80, targetPort: http}
  - name: hdb
    namespace: shop
    selector: {app: hdb}
    ports:
      - {name: db, port: 90, targetPort: db}
"""

#: the server pod behind each Service, and what a mixed cluster counts of its bytes
SERVER = {"web": "web-a1", "hweb": "hweb-hb1", "hdb": "hdb-ha1"}
TIMES = {"web": 1, "hweb": 2, "hdb": 0}

Key = tuple[str, str, str, str, str]  # service, client_zone, server_zone, crossing, direction


@pytest.fixture(scope="module")
def lab() -> Iterator[object]:
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(TOPOLOGY)) as the_lab:
        yield the_lab


def per_service(texts: list[str]) -> tuple[dict[Key, int], dict[str, int]]:
    """Service bytes summed over the agents per Key, and skipped bytes per reason."""
    got: dict[Key, int] = defaultdict(int)
    skipped: dict[str, int] = defaultdict(int)
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                lb = s.labels
                if s.name == "zonemeter_service_bytes_total" and s.value:
                    got[(lb["service"], lb["client_zone"], lb["server_zone"], lb["crossing"],
                         lb["direction"])] += int(s.value)
                elif s.name == "zonemeter_skipped_bytes_total":
                    skipped[lb["reason"]] += int(s.value)
    return dict(got), dict(skipped)


def truth_per_service(lab) -> dict[Key, int]:  # type: ignore[no-untyped-def]
    """The ground truth per Key, each Service's bytes times what the mix counts of them."""
    topo = lab.topology
    service_of = {pod: svc for svc, pod in SERVER.items()}
    out: dict[Key, int] = defaultdict(int)
    for (client, server, direction), nbytes in lab.ground_truth().items():
        if not nbytes:
            continue
        c, s = topo.pod(client), topo.pod(server)
        cz, sz = topo.zone_of(c.node), topo.zone_of(s.node)
        crossing = "same_node" if c.node == s.node else "same_zone" if cz == sz else "cross_zone"
        svc = service_of[server]
        if TIMES[svc]:
            out[(svc, cz, sz, crossing, direction)] += TIMES[svc] * nbytes
    return dict(out)


def mixed_alert_fires(texts: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """promtool: the repository's rules.yml fed the agents' zonemeter_datapath_info series
    (labelled node and job as the PodMonitor does) for 40 minutes; the test expects
    ZonemeterHookMixed to fire at 35 minutes (its `for` is 30)."""
    series = []
    for node, text in texts.items():
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "zonemeter_datapath_info":
                    labels = {**s.labels, "node": node, "job": "zonemeter"}
                    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    series.append({"series": f"zonemeter_datapath_info{{{body}}}", "values": "1x40"})
    assert len(series) == 2, series
    (rule,) = [r for g in yaml.safe_load((MON / "rules.yml").read_text())["groups"] for r in g["rules"]
               if r.get("alert") == "ZonemeterHookMixed"]
    annotations = {k: v.replace("{{ $value }}", "2") for k, v in rule["annotations"].items()}
    test = {"rule_files": [str(MON / "rules.yml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                {"alertname": "ZonemeterHookMixed", "eval_time": "35m",
                 "exp_alerts": [{"exp_labels": {"severity": "warning"},
                                 "exp_annotations": annotations}]}]}]}
    path = tmp / "mixed_test.yml"
    path.write_text(yaml.safe_dump(test))
    return subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=120)


def test_two_hooks_count_host_network_services_twice_or_not_at_all_and_are_alerted(
        lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    b1_scope = ",".join([lab.node_netns("b1")] + [lab.pod_netns(p.name) for p in lab.topology.pods_on("b1")
                                                   if not p.host_network])
    extra = {"a1": ["--hook", "veth"],
             "b1": ["--hook", "cgroup", "--cgroup-scope-netns", b1_scope,
                    "--uplink-interfaces", f"{lab.prefix}u*"]}
    agents = Agents(lab, snapshot, tmp_path, attach={"a1": "auto", "b1": "auto"}, extra=extra)
    try:
        agents.wait_ready()
        lab.reset_ground_truth()
        for client, svc, port in (("client-a1", "web", 80), ("client-b1", "web", 80),
                                  ("client-a1", "hweb", 80), ("client-b1", "hdb", 90)):
            r = lab.run_flow(client, lab.cluster_ip(f"shop/{svc}"), port, "tcp", 1200, 9000, count=8)
            assert (r.ok, r.failed) == (8, 0), (client, svc, r)
        time.sleep(INTERVAL * 1.5)
        texts = {n: agents.scrape(n) for n in ("a1", "b1")}
        got, skipped = per_service(list(texts.values()))
        truth = lab.ground_truth()
        for svc, server in SERVER.items():  # every Service's server saw its calls
            assert any(s == server and v for (_, s, _), v in truth.items()), (svc, truth)
        # web once, hweb twice, hdb not at all: exactly
        assert got == truth_per_service(lab)
        hdb = sum(v for (_, s, _), v in truth.items() if s == "hdb-ha1")
        # where hdb's bytes went: b1 skipped them as a client's copy of a ClusterIP call
        assert skipped.get("clusterip_client_copy", 0) >= hdb
        # the agents say which hook they count on, and the alert reads exactly that
        assert 'zonemeter_datapath_info{attach="tcx",hook="veth",requested="veth"} 1.0' in texts["a1"]
        assert 'zonemeter_datapath_info{attach="cgroup",hook="cgroup",requested="cgroup"} 1.0' in texts["b1"]
        fired = mixed_alert_fires(texts, tmp_path)
        assert fired.returncode == 0, fired.stdout + fired.stderr
        # the same rule on two agents of one hook stays quiet (promtool fails the test then)
        same = mixed_alert_fires({"a1": texts["a1"], "b1": texts["a1"]}, tmp_path)
        assert same.returncode != 0 and "ZonemeterHookMixed" in same.stdout + same.stderr, same.stdout
        assert agents.stop() == {"a1": 0, "b1": 0}
    finally:
        agents.kill()
