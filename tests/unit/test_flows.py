"""counted_once: the userspace half of the once-only counting rule (DESIGN.md)."""

from __future__ import annotations

import ipaddress

import pytest

from agent.flows import counted_once
from agent.records import FlowDelta, FlowKind

POD = ipaddress.ip_address("10.1.0.5")
PEER = ipaddress.ip_address("10.2.0.7")


def delta(kind: FlowKind, overflow: bool = False) -> FlowDelta:
    return FlowDelta(kind, POD, PEER, 80, 6, 1000, 3, overflow)


@pytest.mark.parametrize("kind", [FlowKind.REQUEST, FlowKind.RESPONSE])
@pytest.mark.parametrize("pod,frontend", [(True, True), (True, False), (False, False)])
def test_service_deltas_always_kept(kind: FlowKind, pod: bool, frontend: bool) -> None:
    assert counted_once(delta(kind), remote_is_pod=pod, remote_is_frontend=frontend)


@pytest.mark.parametrize("kind", [FlowKind.EGRESS, FlowKind.INGRESS])
def test_client_side_copy_of_service_traffic_dropped(kind: FlowKind) -> None:
    assert not counted_once(delta(kind), remote_is_pod=True, remote_is_frontend=True)
    assert not counted_once(delta(kind), remote_is_pod=False, remote_is_frontend=True)


def test_pod_to_pod_counted_outbound_only() -> None:
    assert counted_once(delta(FlowKind.EGRESS), remote_is_pod=True, remote_is_frontend=False)
    assert not counted_once(delta(FlowKind.INGRESS), remote_is_pod=True, remote_is_frontend=False)


def test_non_pod_remote_counted_both_directions() -> None:
    assert counted_once(delta(FlowKind.EGRESS), remote_is_pod=False, remote_is_frontend=False)
    assert counted_once(delta(FlowKind.INGRESS), remote_is_pod=False, remote_is_frontend=False)


def test_overflow() -> None:
    assert counted_once(delta(FlowKind.REQUEST, True), remote_is_pod=False, remote_is_frontend=False)
    for kind in (FlowKind.EGRESS, FlowKind.INGRESS):
        with pytest.raises(ValueError, match="overflow"):
            counted_once(delta(kind, True), remote_is_pod=False, remote_is_frontend=False)


def test_fast_delta_equals_constructor() -> None:
    from agent.flows import _fast_delta

    args = (FlowKind.RESPONSE, POD, PEER, 8080, 17, 12345, 9)
    fast = _fast_delta(*args)
    assert fast == FlowDelta(*args)
    assert hash(fast) == hash(FlowDelta(*args))
    with pytest.raises(AttributeError):
        fast.bytes = 1  # type: ignore[misc]
