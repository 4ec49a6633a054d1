"""Pod churn (docs/reliability.md): a rolling update of all 6 ``api`` replicas while traffic runs,
each new pod taking the deleted pod's address within about a second; real agents (one per
lab node, ``--interval 1``) reading the snapshot the lab rewrites.

Every byte must go to the pod that owned the address when the byte was counted:

* per (client zone, server zone, crossing, direction) the ``shop/api`` bytes equal the
  lab's nftables counters (nothing lost while endpoints move, nothing twice);
* per workload (each lab pod is its own workload) the non-Service egress bytes equal what
  the lab counted from that pod: the old and the new owner of an address each get exactly
  their own bytes.

Scenario and checks: bench/soak.py (the 10-minute soak runs the same cluster).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.soak import ChurnRun
from tools.lab.proc import early_pod_cgroup

pytestmark = pytest.mark.e2e


def _wait_until_every_api_pod_sent(cr: ChurnRun, timeout: float = 15.0) -> None:
    """Wait until the lab counted request bytes from every first-generation ``api`` pod to
    its ``db``: each old owner of an address must have bytes of its own before it goes."""
    deadline = time.monotonic() + timeout
    while True:
        sent = {c for (c, s, d), n in cr.lab.ground_truth().items()
                if s.startswith("db-") and d == "request" and n > 0}
        if all(pod in sent for pod in cr.api.values()):
            return
        assert time.monotonic() < deadline, f"api pods without bytes: {set(cr.api.values()) - sent}"
        time.sleep(0.2)


def test_rolling_update_with_address_reuse_attributes_every_byte(tmp_path: Path) -> None:
    with ChurnRun(tmp_path, interval=1.0) as cr:
        cr.start_traffic(22)
        _wait_until_every_api_pod_sent(cr)
        for slot in range(1, 7):
            assert cr.replace_api(slot, f"api-v2-{slot}"), slot  # same address
        assert cr.traffic_running()  # the last new pods still send
        while cr.traffic_running():
            time.sleep(0.2)
        res = cr.finish()
    assert (res.replacements, res.reused, res.failed_requests) == (6, 6, 0)
    assert res.service_agents == res.service_truth
    assert {k[2] for k in res.service_truth} == {"same_node", "same_zone", "cross_zone"}
    assert res.workload_agents == res.workload_truth
    # both owners of every reused address sent bytes of their own
    for slot in range(1, 7):
        assert res.workload_truth.get(f"api-{slot}", 0) > 0, slot
        assert res.workload_truth.get(f"api-v2-{slot}", 0) > 0, slot
    assert not res.unattributed
    # outside the lab's ground truth: only the new interfaces' IPv6 link-local chatter
    assert set(res.workload_other) <= {"unknown"}
    assert sum(res.workload_other.values()) < 1000 * res.replacements


@pytest.mark.parametrize("hook", ["veth", "cgroup"])
def test_address_reused_while_the_metadata_is_stale_goes_to_the_new_pod(tmp_path: Path,
                                                                        hook: str) -> None:
    """The new pod takes the deleted pod's address at once (no gap) and sends for 3 s
    (three drains at ``--interval 1``) before the snapshot announces it: the agents'
    metadata shows the old pod deleted and no new holder, which by time would credit the
    new pod's bytes to the old one. The kernel keys them by the new pod's veth (on the
    cgroup hook: by its pod cgroup, made after the old pod's, tools/lab/proc.py): they
    are held until the metadata names its pod, and each owner gets exactly its own bytes."""
    with ChurnRun(tmp_path, interval=1.0, hook=hook) as cr:
        cr.start_traffic(14)
        _wait_until_every_api_pod_sent(cr)
        for slot in (1, 4):  # one replica on n1, one on n2
            assert cr.replace_api(slot, f"api-v2-{slot}", stale_seconds=3.0), slot
        while cr.traffic_running():
            time.sleep(0.2)
        res = cr.finish()
    assert (res.replacements, res.reused, res.failed_requests) == (2, 2, 0)
    for slot in (1, 4):
        assert res.workload_truth.get(f"api-{slot}", 0) > 0, slot
        assert res.workload_truth.get(f"api-v2-{slot}", 0) > 0, slot
    assert res.workload_agents == res.workload_truth
    assert res.service_agents == res.service_truth
    assert not res.unattributed


def test_replacement_whose_pod_cgroup_predates_the_previous_holder_goes_to_it(tmp_path: Path) -> None:
    """Cgroup hook. kubelet makes a pod's cgroup before its volumes are mounted: a pod that
    waited for a volume has an older pod cgroup than a pod created, given the address and
    deleted meanwhile. Here api-v3-1's pod cgroup is made first, then api-v2-1 takes
    api-1's address and sends, then api-v3-1 takes it and sends for 3 s before the
    snapshot announces it. Ordered by pod cgroup ids its bytes would go to api-v2-1;
    ordered by the pods' containers (PodCgroupOrder) each owner gets exactly its own."""
    with ChurnRun(tmp_path, interval=1.0, hook="cgroup") as cr:
        cr.start_traffic(16)
        _wait_until_every_api_pod_sent(cr)
        node = cr.lab.topology.pod("api-1").node
        early = early_pod_cgroup(cr.lab.prefix, node, "api-v3-1")
        assert cr.replace_api(1, "api-v2-1")
        mid = cr.lab.pod_cgroup("api-v2-1")
        assert mid is not None and os.stat(early).st_ino < os.stat(mid.parent).st_ino
        deadline = time.monotonic() + 15
        while not any(c == "api-v2-1" and d == "request" and n > 0
                      for (c, s, d), n in cr.lab.ground_truth().items()):
            assert time.monotonic() < deadline, "api-v2-1 sent nothing"
            time.sleep(0.2)
        time.sleep(1.5)  # a drain of api-v2-1's bytes while it holds the address
        assert cr.replace_api(1, "api-v3-1", stale_seconds=3.0)
        assert cr.lab.pod_cgroup("api-v3-1") == early / "app"
        while cr.traffic_running():
            time.sleep(0.2)
        res = cr.finish()
    assert (res.replacements, res.reused, res.failed_requests) == (2, 2, 0)
    for pod in ("api-1", "api-v2-1", "api-v3-1"):
        assert res.workload_truth.get(pod, 0) > 0, pod
    assert res.workload_agents == res.workload_truth
    assert res.service_agents == res.service_truth
    assert not res.unattributed
