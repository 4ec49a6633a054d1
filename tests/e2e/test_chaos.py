"""The chaos soak (bench/chaos.py), short: the same code as the 30-minute run of
BENCHMARKS.md ("Chaos soak"), so it cannot rot.

About 70 s of traffic on the churn cluster on the lab's real Kubernetes, with every kind
of trouble at least once: api pods replaced with their addresses reused, agents killed
with SIGKILL or SIGTERM and restarted on their pins and checkpoints, client links flapped,
kube-apiserver stopped and started, a 16-flow table that overflows on one node. At the
end every agent's Service bytes plus its request/response overflow equal the lab's count
for the server pods of its node, exactly; no counter any scrape saw ever went down; every
checkpoint holds what its agent exports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import ChaosSettings, chaos

pytestmark = pytest.mark.e2e


def test_chaos_every_byte_once_and_no_counter_goes_back(tmp_path: Path) -> None:
    st = ChaosSettings(duration=70, kubernetes="real", interval=1.0, flow_capacity=16,
                       churn_every=15, kill_every=12, flap_every=12, outage_every=60,
                       outage_seconds=12, sample_every=5, seed=18)
    out = chaos(st, tmp_path, progress=print)
    ev = out["events"]
    # every kind of trouble happened
    assert ev["replacements"] >= 1 and ev["reused"] == ev["replacements"], ev
    assert ev["kills"] + ev["terms"] >= 1, ev
    assert ev["flaps"] >= 1 and ev["outages"] >= 1, ev
    nodes = out["per_node"]
    # the small table overflowed, and every node served traffic
    assert nodes["n1"]["request_response_overflow_bytes"] > 0, nodes
    assert all(n["truth_served_bytes"] > 0 for n in nodes.values()), nodes
    for name, n in nodes.items():
        assert n["service_bytes"] + n["request_response_overflow_bytes"] == \
            n["truth_served_bytes"], (name, n)
    assert out["monotonic"]["scrapes"] > 100
    assert out["monotonic"]["decreases"] == []
    assert all(out["checkpoint_equals_export"].values()), out["checkpoint_equals_export"]
    assert out["ok"]
