"""Why bytes ignored the hints: a verdict per Service and client node (docs/attribution.md,
"Why bytes ignored the hints").

Hint-ignored bytes are counted where the endpoint's bytes are counted (the endpoint's node),
which sees the packet after the client's node rewrote a ClusterIP to an endpoint: it cannot
tell a ClusterIP call from a direct dial. The client's node can: its agent sees its pods'
own copies, addressed to the Service (``path="clusterip"``) or to an endpoint outside its
kube-proxy's selection (``path="direct"``), in ``zonemeter_service_client_path_bytes_total``.
Joining the two on ``client_node`` (summed over agents, as Prometheus would) gives each
hint-ignored byte one cause:

* ``client-side``: the client dialled an endpoint address directly (mesh sidecars, gRPC
  or socket-level load balancing, headless Services): the client node's direct-dial bytes,
  at most the hint-ignored bytes from that node;
* ``data-plane``: the rest, when the client node's agent saw its pods call the Service's
  address: the node's data plane forwarded outside the hinted set (an old kube-proxy, a
  CNI's service proxy without topology support);
* ``external``: the client's address is the node's own (``client_kind="node"``): a
  NodePort/LoadBalancer hop masqueraded to the node that received it, or a host-network
  client on that node (the bytes cannot tell these apart);
* ``unknown``: no evidence from the client's node (no agent there, ``client_node`` is
  ``other`` or ``unknown``, or its agent saw neither path).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CAUSES", "HintVerdict", "hint_verdicts", "verdict_sentence"]

DATA_PLANE = "data-plane"
CLIENT_SIDE = "client-side"
EXTERNAL = "external"
UNKNOWN_CAUSE = "unknown"
#: every cause, in the order verdicts list them
CAUSES: tuple[str, ...] = (DATA_PLANE, CLIENT_SIDE, EXTERNAL, UNKNOWN_CAUSE)

#: hint-ignored key: (namespace, service, client_node, client_kind)
IgnoredKey = tuple[str, str, str, str]
#: client path key: (namespace, service, client_node, path)
PathKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class HintVerdict:
    """Hint-ignored bytes of one Service from one client node, with their cause.

    Attributes:
        namespace, service: the Service.
        client_node: the client's node (``other``/``unknown`` when the series had none).
        cause: one of :data:`CAUSES`.
        bytes: L3 bytes (both directions) of this cause.
        kube_proxy_version: the kube-proxy version the client node reports
            (``status.nodeInfo.kubeProxyVersion``), when known.
    """

    namespace: str
    service: str
    client_node: str
    cause: str
    bytes: int
    kube_proxy_version: str | None = None


def hint_verdicts(ignored: Mapping[IgnoredKey, int], paths: Mapping[PathKey, int],
                  proxy_versions: Mapping[str, str] | None = None) -> list[HintVerdict]:
    """Split hint-ignored bytes into causes (module docstring), per Service and client node.

    Args:
        ignored: ``(namespace, service, client_node, client_kind) -> bytes`` of
            ``zonemeter_service_hint_ignored_bytes_total``, summed over agents and zones.
        paths: ``(namespace, service, client_node, path) -> bytes`` of
            ``zonemeter_service_client_path_bytes_total``, summed over agents.
        proxy_versions: node -> the kube-proxy version its Node reports, where known.

    Returns:
        verdicts with bytes > 0, sorted by Service, then bytes descending, then node and
        cause (:data:`CAUSES` order). Bytes of one (Service, node) add up to its
        hint-ignored bytes.
    """
    by_node: dict[tuple[str, str, str], dict[str, int]] = {}
    for (ns, svc, node, kind), n in ignored.items():
        if n > 0:
            d = by_node.setdefault((ns, svc, node), {})
            k = "node" if kind == "node" else "pod"
            d[k] = d.get(k, 0) + int(n)
    versions = proxy_versions or {}
    out: list[HintVerdict] = []
    for (ns, svc, node), kinds in by_node.items():
        causes: dict[str, int] = {}
        if kinds.get("node"):
            causes[EXTERNAL] = kinds["node"]
        pod = kinds.get("pod", 0)
        if pod:
            direct = paths.get((ns, svc, node, "direct"), 0)
            clusterip = paths.get((ns, svc, node, "clusterip"), 0)
            client_side = min(pod, direct)
            rest = pod - client_side
            if rest and not clusterip and client_side:
                client_side, rest = pod, 0  # only direct dials seen: a counting skew
            if client_side:
                causes[CLIENT_SIDE] = client_side
            if rest:
                causes[DATA_PLANE if clusterip else UNKNOWN_CAUSE] = rest
        for cause, n in causes.items():
            out.append(HintVerdict(ns, svc, node, cause, n, versions.get(node)))
    out.sort(key=lambda v: (v.namespace, v.service, -v.bytes, v.client_node, CAUSES.index(v.cause)))
    return out


def _rate(n: int, seconds: float | None) -> str:
    if seconds and seconds > 0:
        return f"{n / seconds:,.0f} bytes/s"
    return f"{n:,} bytes"


def verdict_sentence(v: HintVerdict, seconds: float | None = None) -> str:
    """One plain sentence for a verdict; ``seconds``: the window the bytes were sent in
    (the sentence then says bytes/s), None for bytes."""
    rate = _rate(v.bytes, seconds)
    if v.cause == DATA_PLANE:
        version = f", kube-proxy {v.kube_proxy_version} there" if v.kube_proxy_version else ""
        return (f"locality configured, but node {v.client_node}'s data plane ignores the "
                f"hints ({rate}{version})")
    if v.cause == CLIENT_SIDE:
        return (f"clients of this Service on node {v.client_node} choose endpoints themselves "
                f"(direct dials: mesh sidecar, client-side or socket-level balancing, headless "
                f"DNS) ({rate})")
    if v.cause == EXTERNAL:
        return (f"{rate} came in through node {v.client_node}'s address (a NodePort or "
                f"LoadBalancer hop, or a host-network client there) and left the hinted set")
    return (f"{rate} from node {v.client_node} ignored the hints; no agent evidence says "
            f"whether its clients used the ClusterIP or dialled endpoints")

