"""The parser of Kubernetes API objects (JSON shape) into the records the stages read.

Two families of records are built here from the same helpers and label names:

* the hint model's records (:class:`NodeInfo`, :class:`ServiceInfo`, :class:`Slice` of
  :class:`Endpoint` with :class:`Hints`): strict, bad input raises
  :class:`agent.errors.InputError` naming the object and field;
* the metadata cache's records (:class:`PodRecord`, :class:`NodeRecord`,
  :class:`ServiceRecord`): lenient, an unusable object raises :class:`BadObject` (counted
  and skipped by the cache).

See docs/metadata.md (cache) and docs/hints.md (hint model).
"""

from __future__ import annotations

import ipaddress
import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from agent.errors import InputError
from agent.k8s.cidrs import IPNetwork
from agent.records import IPAddress

#: ``topology.kubernetes.io/zone`` (``k8s.io/api/core/v1`` ``LabelTopologyZone``)
LABEL_ZONE = "topology.kubernetes.io/zone"
#: ``failure-domain.beta.kubernetes.io/zone``, read by the cache when the GA label is absent
LABEL_ZONE_BETA = "failure-domain.beta.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_REGION_BETA = "failure-domain.beta.kubernetes.io/region"
#: EndpointSlice -> Service (``discovery/v1`` ``LabelServiceName``)
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
#: EndpointSlice manager (``discovery/v1`` ``LabelManagedBy``)
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
#: the EndpointSlice controller's ``managed-by`` value (``endpointslice`` ``ControllerName``)
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
#: node labels the topology cache skips (``topologycache.go`` ``SetNodes``)
EXCLUDED_NODE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
LABEL_POD_TEMPLATE_HASH = "pod-template-hash"


# ------------------------------------------------------------------ metadata-cache records

#: annotations the hint model sees (prune_service keeps these before parse_service_info reads it)
KEPT_ANNOTATIONS = frozenset({
    "service.kubernetes.io/topology-mode",
    "service.kubernetes.io/topology-aware-hints",
    "endpointslice.kubernetes.io/skip-mirror",
})


#: IANA protocol numbers of the protocols a Service port can name
PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}


def _intern(value: Any) -> str | None:
    return sys.intern(value) if isinstance(value, str) and value else None


def _ip(value: Any) -> IPAddress | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The slice of a Pod the agent needs.

    Attributes:
        namespace, name: the pod.
        node: ``spec.nodeName`` (None while unscheduled).
        ips: ``status.podIPs`` (falls back to ``status.podIP``).
        workload, workload_kind: owning workload after walking ReplicaSet -> Deployment;
            the pod itself (kind ``Pod``) when it has no owner.
        host_network: ``spec.hostNetwork``.
        terminal: phase Succeeded or Failed (its IPs are released).
        since: when the cache first saw the pod holding its IPs (seconds since the epoch,
            cache clock); 0.0 straight out of :func:`parse_pod`.
        host_ports: the ``(port, protocol number)`` pairs of the node's address the pod
            serves, sorted: for a host-network pod every ``containerPort`` and ``hostPort``
            of ``spec.containers[].ports`` and ``spec.initContainers[].ports`` (with host
            networking both are ports of the node's address); for any other pod its
            ``hostPort`` values (the CNI's portmap plugin DNATs them to the pod);
            ``()`` when there are none.
        host_port_targets: for a pod that is not host-network, ``(hostPort, protocol
            number, containerPort)`` of each declared ``hostPort``: where the portmap DNAT
            sends ``node:hostPort`` (:func:`pod_host_port_targets`); ``()`` otherwise.
    """

    namespace: str
    name: str
    node: str | None
    ips: tuple[IPAddress, ...]
    workload: str
    workload_kind: str
    host_network: bool
    terminal: bool
    since: float = 0.0
    host_ports: tuple[tuple[int, int], ...] = ()
    host_port_targets: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """The slice of a Node the agent needs.

    Attributes:
        name: the node.
        zone: ``topology.kubernetes.io/zone`` (fallback ``failure-domain.beta...``), or None.
        region: ``topology.kubernetes.io/region`` (same fallback), or None.
        addresses: InternalIP and ExternalIP addresses.
        pod_cidrs: ``spec.podCIDRs`` (or ``spec.podCIDR``).
    """

    name: str
    zone: str | None
    region: str | None
    addresses: tuple[IPAddress, ...]
    pod_cidrs: tuple[IPNetwork, ...]


@dataclass(frozen=True, slots=True)
class ServicePortSpec:
    """One entry of ``Service.spec.ports``.

    Attributes:
        name: the port's name ("" when unnamed).
        port: the Service port number.
        protocol: IP protocol number.
        target_port: numeric ``targetPort`` (defaults to ``port``), or 0 when it names a
            container port (resolved per endpoint by EndpointSlices).
        node_port: ``nodePort`` (1..65535), or 0 when unset or unusable.
    """

    name: str
    port: int
    protocol: int
    target_port: int
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    """The slice of a Service the agent needs.

    Attributes:
        namespace, name: the Service.
        cluster_ips: ``spec.clusterIPs`` (or ``spec.clusterIP``); empty for headless.
        ports: ``spec.ports``.
        external_ips: the parseable addresses of ``spec.externalIPs``, in order.
        lb_ips: the parseable ``status.loadBalancer.ingress[].ip`` addresses, in order
            (entries with only a ``hostname`` have none).
        external_local: ``spec.externalTrafficPolicy`` is ``Local`` (node ports, externalIPs
            and LoadBalancer IPs reach only the receiving node's endpoints, with the
            client's address kept); False for ``Cluster``, the API's default.
    """

    namespace: str
    name: str
    cluster_ips: tuple[IPAddress, ...]
    ports: tuple[ServicePortSpec, ...]
    external_ips: tuple[IPAddress, ...] = ()
    lb_ips: tuple[IPAddress, ...] = ()
    external_local: bool = False


class BadObject(ValueError):
    """An API object this cache cannot use (counted and logged once, never fatal)."""


#: what parsing an object of unexpected shape can raise (all mean "skip this object")
BAD_SHAPE = (BadObject, AttributeError, TypeError, ValueError, KeyError, IndexError)


def _sub(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Return ``obj[key]`` when it is an object, else an empty dict."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _named_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise BadObject("metadata.name missing")
    return meta


def _labels(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = meta.get("labels")
    return labels if isinstance(labels, dict) else {}


def workload_of(meta: Mapping[str, Any]) -> tuple[str, str]:
    """Return ``(workload, kind)`` of a Pod from its metadata.

    The controller ownerReference (else the first one) names the workload; a ReplicaSet
    named ``<deployment>-<pod-template-hash label>`` maps to Deployment ``<deployment>``
    (Deployment controller naming, ``pkg/controller/deployment/sync.go``). Without owners
    the pod is its own workload (kind ``Pod``).
    """
    owners = meta.get("ownerReferences")
    owner: Mapping[str, Any] | None = None
    if isinstance(owners, list):
        refs = [o for o in owners if isinstance(o, dict) and isinstance(o.get("name"), str)]
        owner = next((o for o in refs if o.get("controller") is True), refs[0] if refs else None)
    if owner is None:
        return str(meta.get("name")), "Pod"
    kind = str(owner.get("kind") or "unknown")
    name = str(owner["name"])
    if kind == "ReplicaSet":
        tmpl_hash = _labels(meta).get(LABEL_POD_TEMPLATE_HASH)
        if isinstance(tmpl_hash, str) and tmpl_hash and name.endswith("-" + tmpl_hash):
            return name[: -len(tmpl_hash) - 1], "Deployment"
    return name, kind


def parse_pod(obj: Mapping[str, Any]) -> PodRecord:
    """Slim a Pod (API JSON shape) into a :class:`PodRecord`.

    Raises:
        BadObject: metadata.name missing or the object is not a mapping.
    """
    meta = _named_meta(obj)
    spec = _sub(obj, "spec")
    status = _sub(obj, "status")
    ips: list[IPAddress] = []
    pod_ips = status.get("podIPs")
    if isinstance(pod_ips, list):
        for entry in pod_ips:
            ip = _ip(entry.get("ip")) if isinstance(entry, dict) else None
            if ip is not None and ip not in ips:
                ips.append(ip)
    if not ips:
        ip = _ip(status.get("podIP"))
        if ip is not None:
            ips.append(ip)
    workload, kind = workload_of(meta)
    host_network = spec.get("hostNetwork") is True
    return PodRecord(
        namespace=_intern(meta.get("namespace")) or "default",
        name=meta["name"],
        node=_intern(spec.get("nodeName")),
        ips=tuple(ips),
        workload=sys.intern(workload),
        workload_kind=sys.intern(kind),
        host_network=host_network,
        terminal=status.get("phase") in ("Succeeded", "Failed"),
        host_ports=pod_host_ports(spec, host_network),
        host_port_targets=() if host_network else pod_host_port_targets(spec),
    )


#: ``ContainerPort.protocol`` names -> IP protocol numbers (default TCP, core/v1 types.go)
_PORT_PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}


def _declared_ports(spec: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], int]]:
    """Every well-formed ``ports[]`` entry of ``spec.containers`` and
    ``spec.initContainers`` with its protocol number (TCP when unset, core/v1
    ``ContainerPort``); entries that are not objects or name an unknown protocol are
    skipped."""
    for group in ("containers", "initContainers"):
        containers = spec.get(group)
        for c in containers if isinstance(containers, list) else ():
            ports = c.get("ports") if isinstance(c, dict) else None
            for p in ports if isinstance(ports, list) else ():
                if not isinstance(p, dict):
                    continue
                proto = _PORT_PROTOCOLS.get(p.get("protocol") or "TCP")
                if proto is not None:
                    yield p, proto


def pod_host_ports(spec: Mapping[str, Any], host_network: bool = True) -> tuple[tuple[int, int], ...]:
    """The ``(port, protocol number)`` pairs of its node's address a pod serves, sorted.

    Reads ``containerPort`` and ``hostPort`` of every ``ports[]`` entry of
    ``spec.containers`` and ``spec.initContainers`` (sidecars serve too); ``protocol``
    defaults to TCP (core/v1 ``ContainerPort``). With ``hostNetwork`` the API server's
    defaulting sets ``hostPort`` to ``containerPort`` (``pkg/apis/core/v1/defaults.go``
    ``SetDefaults_Pod``), so both name the port on the node's address. Without it only
    ``hostPort`` does: the CNI's portmap plugin DNATs ``node:hostPort`` to the pod
    (containernetworking/plugins ``plugins/meta/portmap``). Malformed entries
    (not objects, ports outside 1..65535, unknown protocols) are skipped, never raised:
    a declared port is a resolution hint, not something the agent must understand.
    """
    out: set[tuple[int, int]] = set()
    for p, proto in _declared_ports(spec):
        for field_ in ("containerPort", "hostPort") if host_network else ("hostPort",):
            n = p.get(field_)
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 65536:
                out.add((n, proto))
    return tuple(sorted(out))


def pod_host_port_targets(spec: Mapping[str, Any]) -> tuple[tuple[int, int, int], ...]:
    """``(hostPort, protocol number, containerPort)`` of every ``ports[]`` entry of
    ``spec.containers`` and ``spec.initContainers`` that declares both, sorted: the CNI's
    portmap plugin DNATs ``node:hostPort`` to ``pod:containerPort``, keeping the client's
    address (containernetworking/plugins ``plugins/meta/portmap``, its DNAT chain). Malformed
    entries are skipped, as :func:`pod_host_ports` skips them."""
    out: set[tuple[int, int, int]] = set()
    for p, proto in _declared_ports(spec):
        host, target = p.get("hostPort"), p.get("containerPort")
        if (isinstance(host, int) and isinstance(target, int)
                and _port_number(host) and _port_number(target)):
            out.add((host, proto, target))
    return tuple(sorted(out))


def _label2(labels: Mapping[str, Any], first: str, second: str) -> str | None:
    value = labels.get(first)
    if not isinstance(value, str) or not value:
        value = labels.get(second)
    return _intern(value)


def parse_node(obj: Mapping[str, Any]) -> NodeRecord:
    """Slim a Node into a :class:`NodeRecord` (zone and region labels with beta fallback).

    Raises:
        BadObject: metadata.name missing.
    """
    meta = _named_meta(obj)
    labels = _labels(meta)
    spec = _sub(obj, "spec")
    status = _sub(obj, "status")
    addrs: list[IPAddress] = []
    for entry in status.get("addresses") or ():
        if isinstance(entry, dict) and entry.get("type") in ("InternalIP", "ExternalIP"):
            ip = _ip(entry.get("address"))
            if ip is not None and ip not in addrs:
                addrs.append(ip)
    cidrs: list[IPNetwork] = []
    raw_cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    for c in raw_cidrs if isinstance(raw_cidrs, list) else ():
        if not isinstance(c, str):  # ip_network(True) would be 0.0.0.1/32
            continue
        try:
            cidrs.append(ipaddress.ip_network(c, strict=False))
        except (ValueError, TypeError):
            continue
    return NodeRecord(
        name=sys.intern(meta["name"]),
        zone=_label2(labels, LABEL_ZONE, LABEL_ZONE_BETA),
        region=_label2(labels, LABEL_REGION, LABEL_REGION_BETA),
        addresses=tuple(addrs),
        pod_cidrs=tuple(cidrs),
    )


def protocol_number(value: Any) -> int:
    """Map a Kubernetes protocol name (default TCP) to its IANA number.

    Raises:
        BadObject: an unknown protocol name.
    """
    if value is None:
        return 6
    try:
        return PROTOCOLS[value]
    except (KeyError, TypeError):
        raise BadObject(f"unknown protocol {value!r}") from None


def _port_number(value: Any) -> bool:
    """True for an int port 1..65535 (bool excluded)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 65535


def parse_service(obj: Mapping[str, Any]) -> ServiceRecord:
    """Slim a Service into a :class:`ServiceRecord`.

    Raises:
        BadObject: metadata.name missing, a port without a number, an unknown protocol.
    """
    meta = _named_meta(obj)
    spec = _sub(obj, "spec")
    ips: list[IPAddress] = []
    for raw in spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else []):
        ip = _ip(raw)  # "None" (headless) is not an address and drops out here
        if ip is not None and ip not in ips:
            ips.append(ip)
    ports: list[ServicePortSpec] = []
    for i, p in enumerate(spec.get("ports") or ()):
        # JSON true is an int to Python, and would become port 1 labelled "True"; a port
        # outside 1..65535 would become a label no Service can have (the API refuses both)
        if not isinstance(p, dict) or not _port_number(p.get("port")):
            raise BadObject(f"spec.ports[{i}].port missing or not a port number 1..65535")
        target: Any = p.get("targetPort", p["port"])
        if isinstance(target, str) and target.isascii() and target.isdigit():
            target = int(target)
        node_port: Any = p.get("nodePort")
        ports.append(ServicePortSpec(
            name=sys.intern(str(p.get("name") or "")),
            port=p["port"],
            protocol=protocol_number(p.get("protocol")),
            target_port=target if _port_number(target) else 0,  # 0: named, per endpoint
            node_port=node_port if _port_number(node_port) else 0,
        ))
    # the other front doors (see agent.k8s.services); malformed entries are skipped
    raw_ext = spec.get("externalIPs")
    ext = [_ip(a) for a in raw_ext] if isinstance(raw_ext, list) else []
    ingress = _sub(_sub(obj, "status"), "loadBalancer").get("ingress")
    lb = [_ip(i.get("ip")) for i in ingress if isinstance(i, dict)] if isinstance(ingress, list) else []
    return ServiceRecord(namespace=_intern(meta.get("namespace")) or "default",
                         name=meta["name"], cluster_ips=tuple(ips), ports=tuple(ports),
                         external_ips=tuple(a for a in ext if a is not None),
                         lb_ips=tuple(a for a in lb if a is not None),
                         external_local=spec.get("externalTrafficPolicy") == "Local")


def _prune_common(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    meta = obj.get("metadata") or {}
    slim_meta = {k: v for k, v in meta.items()
                 if k in ("name", "namespace", "labels", "uid", "resourceVersion", "generation",
                          "ownerReferences", "creationTimestamp", "deletionTimestamp")}
    ann = meta.get("annotations")
    if isinstance(ann, dict):
        kept = {k: v for k, v in ann.items() if k in KEPT_ANNOTATIONS}
        if kept:
            slim_meta["annotations"] = kept
    out["metadata"] = slim_meta
    return out


def prune_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Return a Node without managedFields, annotations and status beyond what the hint
    model reads (``status.allocatable``, ``status.addresses``, ``status.nodeInfo`` cut to
    its two version fields, and ``status.conditions`` cut to ``type``/``status``/``reason``):
    the form :func:`parse_node_entry` reads in the cache (a ``status`` or ``conditions`` of
    the wrong type is dropped here, not refused)."""
    out = _prune_common(obj)
    _share_labels(out["metadata"])
    status = obj.get("status")
    if isinstance(status, dict):
        slim: dict[str, Any] = {}
        if "addresses" in status:
            slim["addresses"] = status["addresses"]
        if "allocatable" in status:
            slim["allocatable"] = status["allocatable"]
        info = status.get("nodeInfo")
        if isinstance(info, dict):
            kept = {k: info[k] for k in ("kubeProxyVersion", "kubeletVersion") if k in info}
            if kept:
                slim["nodeInfo"] = kept
        conds = status.get("conditions")
        if isinstance(conds, list):
            slim["conditions"] = [
                {k: c[k] for k in ("type", "status", "reason") if k in c} if isinstance(c, dict) else c
                for c in conds]
        out["status"] = slim
    return out


def prune_service(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Return a Service without managedFields and non-topology annotations (status kept):
    the form :func:`parse_service_entry` reads in the cache."""
    out = _prune_common(obj)
    _share_labels(out["metadata"])
    if "status" in obj:
        out["status"] = obj["status"]
    return out


_ENDPOINT_KEYS = ("addresses", "conditions", "hints", "nodeName", "zone")


def _share_labels(meta: dict[str, Any]) -> None:
    labels = meta.get("labels")
    if isinstance(labels, dict):
        # labels differ per object (hostname, service-name), so only their strings are
        # shared (interned), not the dicts
        meta["labels"] = {sys.intern(k) if isinstance(k, str) else k:
                          sys.intern(v) if isinstance(v, str) and len(v) < 128 else v
                          for k, v in labels.items()}


def prune_endpointslice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Return an EndpointSlice without managedFields, non-topology annotations and the
    endpoints' ``targetRef``/``deprecatedTopology``: the form the cache parses."""
    out = _prune_common(obj)
    _share_labels(out["metadata"])
    eps = obj.get("endpoints")
    if isinstance(eps, list):
        slim = []
        for ep in eps:
            if isinstance(ep, dict):
                e = {k: ep[k] for k in _ENDPOINT_KEYS if k in ep}
                if isinstance(e.get("nodeName"), str):
                    e["nodeName"] = sys.intern(e["nodeName"])
                if isinstance(e.get("zone"), str):
                    e["zone"] = sys.intern(e["zone"])
                slim.append(e)
            else:
                slim.append(ep)
        out["endpoints"] = slim
    return out


def object_key(obj: Mapping[str, Any], resource: str | None = None) -> tuple[str, str]:
    """``(namespace, name)`` under which the cache files ``obj`` of ``resource``.

    Nodes are cluster-scoped: ``("", name)`` whatever the object says. Namespaced kinds
    without a namespace (a hand-written snapshot) are filed under ``"default"``, the
    namespace the API server would have put them in and the one :func:`parse_pod`,
    :func:`parse_service` and the hint model use; a key of ``""`` here made a list (or a
    snapshot load) delete the pod or Service it had just added, and a DELETED event miss it.
    """
    meta = _named_meta(obj)
    if resource == "nodes":
        return "", meta["name"]
    ns = meta.get("namespace")
    return (ns if isinstance(ns, str) and ns else "default"), meta["name"]


def slice_ports(sl: Mapping[str, Any]) -> list[tuple[int, int, str]]:
    """``[(port, protocol number, name)]`` of a slice's usable ports (nil ports, which mean
    "all ports", out-of-range ports and unknown protocols are skipped)."""
    out = []
    ports = sl.get("ports")
    for p in ports if isinstance(ports, list) else ():
        if not isinstance(p, dict):
            continue
        port = p.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port <= 65535:
            continue
        try:
            proto = protocol_number(p.get("protocol"))
        except BadObject:
            continue
        name = p.get("name")
        out.append((port, proto, sys.intern(name) if isinstance(name, str) else ""))
    return out


def slice_service_label(obj: Mapping[str, Any]) -> Any:
    """The ``kubernetes.io/service-name`` label of an EndpointSlice, as written (any type).

    Raises:
        BadObject: ``metadata.name`` missing.
    """
    return _labels(_named_meta(obj)).get(LABEL_SERVICE_NAME)


#: ``slice_addresses(node_name=NO_NODE_NAME)``: the endpoints that have no ``nodeName``
NO_NODE_NAME = "\x00no-node-name"


class SliceRecord(NamedTuple):
    """The metadata cache's view of an EndpointSlice: its ports and its endpoints' addresses.

    Attributes:
        ports: ``(port, protocol number, name)`` of the usable ports (:func:`slice_ports`).
        endpoints: per endpoint object, ``(nodeName or NO_NODE_NAME, ready or serving,
            parseable addresses)``; empty for FQDN slices ("10.0.1.5" is also a valid
            FQDN address, and kube-proxy reads IPv4/IPv6 slices only, so such a slice
            names no IP endpoint). ``ready or serving`` counts a nil condition as true,
            as the EndpointSlice API defines.
    """

    ports: tuple[tuple[int, int, str], ...]
    endpoints: tuple[tuple[Any, bool, tuple[IPAddress, ...]], ...]


def parse_slice_record(sl: Mapping[str, Any]) -> SliceRecord:
    """Read an EndpointSlice (API JSON shape) leniently into a :class:`SliceRecord`.

    Malformed ports, endpoints and addresses are skipped, never raised.
    """
    eps: list[tuple[Any, bool, tuple[IPAddress, ...]]] = []
    raw = sl.get("endpoints")
    if sl.get("addressType") != "FQDN":
        for ep in raw if isinstance(raw, list) else ():
            if not isinstance(ep, dict):
                continue
            cond = _sub(ep, "conditions")
            usable = not (cond.get("ready") is False and cond.get("serving", False) is False)
            addrs = ep.get("addresses")
            ips = [_ip(a) for a in addrs] if isinstance(addrs, list) else []
            eps.append((ep.get("nodeName") or NO_NODE_NAME, usable, tuple(a for a in ips if a is not None)))
    return SliceRecord(tuple(slice_ports(sl)), tuple(eps))


def slice_addresses(rec: SliceRecord, node_name: str | None = None) -> list[IPAddress]:
    """Distinct IP addresses of a slice's endpoints, in slice order.

    Args:
        rec: the slice.
        node_name: only endpoints on that node (:data:`NO_NODE_NAME`: those without
            ``nodeName``) that are ready or serving; None: every endpoint.
    """
    out: list[IPAddress] = []
    seen: set[IPAddress] = set()
    for node, usable, ips in rec.endpoints:
        if node_name is not None and (node != node_name or not usable):
            continue
        for ip in ips:
            if ip not in seen:
                seen.add(ip)
                out.append(ip)
    return out


# ------------------------------------------------------------------ hint-model records

@dataclass(frozen=True, slots=True)
class Hints:
    """EndpointSlice ``endpoints[].hints``: zone names and node names (empty tuples if unset)."""

    for_zones: tuple[str, ...] = ()
    for_nodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        """``{"forZones": [...], "forNodes": [...]}`` (names only)."""
        return {"forZones": list(self.for_zones), "forNodes": list(self.for_nodes)}


def hints_json(h: Hints | None) -> dict[str, list[str]] | None:
    """JSON form of optional hints (None stays None)."""
    return None if h is None else h.to_json()


class Endpoint(NamedTuple):
    """One EndpointSlice endpoint, slimmed (``discovery.k8s.io/v1`` Endpoint).

    A NamedTuple rather than a dataclass: a cluster holds hundreds of thousands of these and
    tuple construction is three times cheaper; it is just as immutable.

    Attributes:
        address: ``addresses[0]`` as written in the slice.
        ready, serving, terminating: the conditions; None when unset.
        zone: ``zone``; None when the field is absent ("" kept as "").
        node: ``nodeName``; None when absent.
        hints: ``hints``; None when absent.
    """

    address: str
    ready: bool | None
    serving: bool | None
    terminating: bool | None
    zone: str | None
    node: str | None
    hints: Hints | None

    @property
    def controller_ready(self) -> bool:
        """Ready as the controller counts it: condition set and true (topologycache EndpointReady)."""
        return self.ready is True

    @property
    def proxy_ready(self) -> bool:
        """Ready as kube-proxy sees it: unset counts as true (endpointslicecache.go)."""
        return self.ready is not False


@dataclass(frozen=True, slots=True)
class Slice:
    """One EndpointSlice, slimmed.

    Attributes:
        name: metadata.name.
        address_type: ``IPv4``, ``IPv6`` or ``FQDN``.
        managed: labelled managed-by the EndpointSlice controller (only those get hints).
        ports: ``(name, port)`` pairs of ``ports[]`` (port None when unset).
        endpoints: the endpoints in slice order.
    """

    name: str
    address_type: str
    managed: bool
    ports: tuple[tuple[str, int | None], ...]
    endpoints: tuple[Endpoint, ...]


def _meta(obj: dict[str, Any], kind: str) -> tuple[str, str, dict[str, Any]]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise InputError("missing or not an object", obj=kind, field="metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("missing or not a string", obj=kind, field="metadata.name")
    ns = meta.get("namespace", "default" if kind != "Node" else "")
    if not isinstance(ns, str):
        raise InputError("not a string", obj=f"{kind} {name}", field="metadata.namespace")
    return ns, name, meta


def _str_map(value: Any, where: str, fld: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InputError("must be an object of strings", obj=where, field=fld)
    return {k: ("" if v is None else str(v)) for k, v in value.items()}


def _opt_bool(value: Any, where: str, fld: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise InputError("must be true, false or absent", obj=where, field=fld)


def _opt_str(value: Any, where: str, fld: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InputError("must be a string", obj=where, field=fld)


#: largest CPU quantity whose milli value fits Go's int64 (``Quantity.MilliValue``)
_MAX_CPU = Decimal((1 << 63) - 1) / 1000


def cpu_millis(quantity: Any, where: str, fld: str = "status.allocatable.cpu") -> int:
    """Parse a CPU quantity into milli-CPU, rounding up like Go ``Quantity.MilliValue``.

    Uses ``kubernetes.utils.parse_quantity``.

    Raises:
        InputError: the quantity is malformed, negative, or its milli value exceeds
            int64.
    """
    from kubernetes.utils import parse_quantity

    if quantity is None:
        return 0
    if isinstance(quantity, bool):  # JSON true is no quantity (Go's Quantity refuses it)
        raise InputError(f"bad quantity {quantity!r}: not a number", obj=where, field=fld)
    try:
        q = parse_quantity(quantity)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, InvalidOperation) as err:
        raise InputError(f"bad quantity {quantity!r}: {err}", obj=where, field=fld) from None
    if not isinstance(q, Decimal) or not q.is_finite():  # "NaN", "Infinity": no quantity
        raise InputError(f"bad quantity {quantity!r}: not a finite number", obj=where, field=fld)
    if q < 0:
        raise InputError(f"bad quantity {quantity!r}: negative", obj=where, field=fld)
    # Go's Quantity.MilliValue is an int64; beyond it (1e999999 overflowed the Decimal
    # context: a traceback; 1e100000 cost a 330,000-bit integer per node) it is no CPU count
    if q > _MAX_CPU:
        raise InputError(f"bad quantity {quantity!r}: more than {_MAX_CPU} CPUs", obj=where,
                         field=fld)
    return int(math.ceil(q * 1000))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A Node, slimmed: zone label (None if absent), Ready condition, exclusion, milli-CPU,
    and the kube-proxy version the node reports (:func:`node_proxy_version`, None if none)."""

    name: str
    zone: str | None
    ready: bool
    excluded: bool
    cpu_milli: int
    proxy_version: str | None = None
    #: ``status.allocatable.cpu`` was present (``cpu_milli`` 0 without it, as upstream's
    #: ``Quantity`` of a missing key; told apart only for the message)
    cpu_reported: bool = True


def node_proxy_version(status: Mapping[str, Any]) -> str | None:
    """The kube-proxy version a Node's ``status.nodeInfo`` reports, as written (``v1.31.4``).

    ``kubeProxyVersion`` when set and not empty, else ``kubeletVersion`` as the stand-in:
    ``kubeProxyVersion`` is deprecated (KEP-4004, k8s.io/api ``core/v1/types.go``
    ``NodeSystemInfo``) and kubelets with the ``DisableNodeKubeProxyVersion`` gate (beta, on
    by default from 1.31) leave it empty; kube-proxy may not be older than the kubelet by
    more than the skew policy allows, and usually runs the kubelet's version. A missing
    ``nodeInfo``, or a value that is not a string, reads as None (the version then comes
    from elsewhere); it never makes the Node unreadable.
    """
    info = status.get("nodeInfo")
    if not isinstance(info, Mapping):
        return None
    for key in ("kubeProxyVersion", "kubeletVersion"):
        v = info.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip()
    return None


def parse_node_info(obj: dict[str, Any]) -> NodeInfo:
    """Slim a Node dict.

    Raises:
        InputError: malformed metadata, labels, conditions or allocatable CPU.
    """
    _, name, meta = _meta(obj, "Node")
    where = f"Node {name}"
    labels = _str_map(meta.get("labels"), where, "metadata.labels")
    status = obj.get("status") or {}
    if not isinstance(status, dict):
        raise InputError("must be an object", obj=where, field="status")
    conds = status.get("conditions") or []
    if not isinstance(conds, list):
        raise InputError("must be a list", obj=where, field="status.conditions")
    ready = False
    for i, c in enumerate(conds):
        if not isinstance(c, dict):
            raise InputError("must be an object", obj=where, field=f"status.conditions[{i}]")
        if c.get("type") == "Ready":  # first Ready condition decides (isNodeReady)
            ready = c.get("status") == "True"
            break
    alloc = status.get("allocatable") or {}
    if not isinstance(alloc, dict):
        raise InputError("must be an object", obj=where, field="status.allocatable")
    return NodeInfo(name=name, zone=labels.get(LABEL_ZONE), ready=ready,
                    excluded=any(k in labels for k in EXCLUDED_NODE_LABELS),
                    cpu_milli=cpu_millis(alloc.get("cpu"), where),
                    proxy_version=node_proxy_version(status), cpu_reported=alloc.get("cpu") is not None)


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """A Service, slimmed to what the controller and kube-proxy read."""

    namespace: str
    name: str
    type: str
    annotations: Mapping[str, str]
    traffic_distribution: str | None
    internal_local: bool
    external_local: bool
    externally_accessible: bool
    headless: bool
    ip_families: tuple[str, ...]
    first_port_name: str | None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def parse_service_info(obj: dict[str, Any]) -> ServiceInfo:
    """Slim a Service dict (the flags of kube-proxy ``pkg/proxy/serviceport.go``).

    Raises:
        InputError: malformed fields (object and field named).
    """
    ns, name, meta = _meta(obj, "Service")
    where = f"Service {ns}/{name}"
    ann = _str_map(meta.get("annotations"), where, "metadata.annotations")
    if obj.get("spec") is None:  # the API server always writes one; a hand-made dump may not
        raise InputError("missing (a Service without spec cannot be judged: its type, "
                         "ports and traffic policies are unknown)", obj=where, field="spec")
    spec = obj["spec"]
    if not isinstance(spec, dict):
        raise InputError("must be an object", obj=where, field="spec")
    stype = _opt_str(spec.get("type"), where, "spec.type") or "ClusterIP"
    td = _opt_str(spec.get("trafficDistribution"), where, "spec.trafficDistribution")
    itp = _opt_str(spec.get("internalTrafficPolicy"), where, "spec.internalTrafficPolicy")
    etp = _opt_str(spec.get("externalTrafficPolicy"), where, "spec.externalTrafficPolicy")
    ports = spec.get("ports") or []
    if not isinstance(ports, list):
        raise InputError("must be a list", obj=where, field="spec.ports")
    node_port = False
    first_name: str | None = None
    for i, p in enumerate(ports):
        if not isinstance(p, dict):
            raise InputError("must be an object", obj=where, field=f"spec.ports[{i}]")
        if i == 0:
            first_name = _opt_str(p.get("name"), where, "spec.ports[0].name") or ""
        np_ = p.get("nodePort")
        if np_ not in (None, 0) and not isinstance(np_, int):
            raise InputError("must be an integer", obj=where, field=f"spec.ports[{i}].nodePort")
        node_port = node_port or bool(np_)
    ext_ips = spec.get("externalIPs") or []
    status = obj.get("status") or {}
    lb = ((status.get("loadBalancer") or {}).get("ingress") or []) if isinstance(status, dict) else []
    accessible = node_port or bool(ext_ips) or bool(lb) or stype in ("NodePort", "LoadBalancer")
    external_local = etp == "Local" and (stype in ("NodePort", "LoadBalancer")
                                         or (stype == "ClusterIP" and bool(ext_ips)))
    fams = spec.get("ipFamilies") or []
    if not isinstance(fams, list):
        raise InputError("must be a list", obj=where, field="spec.ipFamilies")
    return ServiceInfo(
        namespace=ns, name=name, type=stype, annotations=ann, traffic_distribution=td,
        internal_local=itp == "Local", external_local=external_local,
        externally_accessible=accessible,
        headless=spec.get("clusterIP") == "None",
        ip_families=tuple(str(f) for f in fams), first_port_name=first_name,
    )


_HINTS_CACHE: dict[tuple[tuple[str, ...], tuple[str, ...]], Hints] = {}


def intern_hints(zones: tuple[str, ...], nodes: tuple[str, ...]) -> Hints:
    key = (zones, nodes)
    h = _HINTS_CACHE.get(key)
    if h is None:
        if len(_HINTS_CACHE) > 100_000:
            _HINTS_CACHE.clear()
        h = _HINTS_CACHE[key] = Hints(zones, nodes)
    return h


def _parse_hints(value: Any, where: str, fld: str) -> Hints | None:
    if value is None:
        return None
    if type(value) is dict and len(value) == 1:  # fast path: {"forZones": [{"name": z}]}
        fz = value.get("forZones")
        if type(fz) is list and len(fz) == 1 and type(fz[0]) is dict:
            name = fz[0].get("name")
            if type(name) is str:
                return intern_hints((name,), ())
    if not isinstance(value, dict):
        raise InputError("must be an object", obj=where, field=fld)
    out: list[tuple[str, ...]] = []
    for key in ("forZones", "forNodes"):
        items = value.get(key) or ()
        if not isinstance(items, (list, tuple)):
            raise InputError("must be a list", obj=where, field=f"{fld}.{key}")
        names = []
        for j, it in enumerate(items):
            name = it.get("name", "") if type(it) is dict else None
            if type(name) is not str:
                raise InputError("must be an object with a string name", obj=where,
                                 field=f"{fld}.{key}[{j}]")
            names.append(name)
        out.append(tuple(names))
    return intern_hints(out[0], out[1])


_EMPTY: dict[str, Any] = {}


def _parse_endpoint_checked(e: Any, where: str, f: str) -> Endpoint:
    """Slow path of endpoint parsing: validate every field and name the bad one."""
    if not isinstance(e, dict):
        raise InputError("must be an object", obj=where, field=f)
    addrs = e.get("addresses")
    if not isinstance(addrs, list) or not addrs or not isinstance(addrs[0], str):
        raise InputError("missing or empty", obj=where, field=f"{f}.addresses")
    cond = e.get("conditions") or {}
    if not isinstance(cond, dict):
        raise InputError("must be an object", obj=where, field=f"{f}.conditions")
    return Endpoint(
        address=addrs[0],
        ready=_opt_bool(cond.get("ready"), where, f"{f}.conditions.ready"),
        serving=_opt_bool(cond.get("serving"), where, f"{f}.conditions.serving"),
        terminating=_opt_bool(cond.get("terminating"), where, f"{f}.conditions.terminating"),
        zone=_opt_str(e.get("zone"), where, f"{f}.zone"),
        node=_opt_str(e.get("nodeName"), where, f"{f}.nodeName"),
        hints=_parse_hints(e.get("hints"), where, f"{f}.hints"),
    )


def parse_slice(obj: dict[str, Any]) -> tuple[str, str, Slice]:
    """Slim an EndpointSlice dict.

    Returns:
        (namespace, service name from the ``kubernetes.io/service-name`` label ("" if
        unlabelled), Slice).

    Raises:
        InputError: malformed fields (object and field named).
    """
    ns, name, meta = _meta(obj, "EndpointSlice")
    where = f"EndpointSlice {ns}/{name}"
    labels = _str_map(meta.get("labels"), where, "metadata.labels")
    at = obj.get("addressType")
    if not isinstance(at, str) or not at:
        raise InputError("missing or not a string", obj=where, field="addressType")
    ports_raw = obj.get("ports") or []
    if not isinstance(ports_raw, list):
        raise InputError("must be a list", obj=where, field="ports")
    ports = []
    for i, p in enumerate(ports_raw):
        if not isinstance(p, dict):
            raise InputError("must be an object", obj=where, field=f"ports[{i}]")
        num = p.get("port")
        if num is not None and (not isinstance(num, int) or isinstance(num, bool)
                                or not 0 < num <= 65535):  # true was "ip:True" in explain
            raise InputError("must be a port number 1..65535", obj=where, field=f"ports[{i}].port")
        ports.append((_opt_str(p.get("name"), where, f"ports[{i}].name") or "", num))
    eps_raw = obj.get("endpoints") or []
    if not isinstance(eps_raw, list):
        raise InputError("must be a list", obj=where, field="endpoints")
    eps = []
    for i, e in enumerate(eps_raw):
        # fast path for well-formed endpoints; anything odd goes to the checked path
        if type(e) is dict:
            addrs = e.get("addresses")
            cond = e.get("conditions") or _EMPTY
            if type(addrs) is list and addrs and type(addrs[0]) is str and type(cond) is dict:
                r, sv, t = cond.get("ready"), cond.get("serving"), cond.get("terminating")
                z, n, h = e.get("zone"), e.get("nodeName"), e.get("hints")
                if (r is None or r is True or r is False) and (sv is None or sv is True or sv is False) \
                        and (t is None or t is True or t is False) and (z is None or type(z) is str) \
                        and (n is None or type(n) is str):
                    eps.append(Endpoint(addrs[0], r, sv, t, z, n,
                                        None if h is None else _parse_hints(h, where, f"endpoints[{i}].hints")))
                    continue
        eps.append(_parse_endpoint_checked(e, where, f"endpoints[{i}]"))
    return ns, labels.get(LABEL_SERVICE_NAME, ""), Slice(
        name=name, address_type=at, managed=labels.get(LABEL_MANAGED_BY) == CONTROLLER_NAME,
        ports=tuple(ports), endpoints=tuple(eps))


def unreadable_node(obj: Any) -> NodeInfo | None:
    """A Node :func:`parse_node` refused, as the topology cache must count it.

    Its allocatable CPU is unknown (``cpu_milli`` -1), so when it is an eligible worker it
    makes the zone ratios insufficient, as zero CPU does (``topologycache.go SetNodes``):
    dropping it would give every Auto Service ratios computed from the other nodes only,
    a silently wrong answer. Zone, exclusion and readiness are read when readable; an
    unreadable Ready condition counts as Ready (the conservative side: Auto refuses).
    Returns None when the object has no name (no Node the API server could hold).
    """
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    raw_labels = meta.get("labels")
    labels: dict[str, Any] = raw_labels if isinstance(raw_labels, dict) else {}
    zone = labels.get(LABEL_ZONE)
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    conds = status.get("conditions") if isinstance(status.get("conditions"), list) else None
    ready = True
    if conds is not None and all(isinstance(c, dict) for c in conds):
        ready = next((c.get("status") == "True" for c in conds if c.get("type") == "Ready"), False)
    return NodeInfo(name=name, zone=zone if isinstance(zone, str) else None, ready=ready,
                    excluded=any(k in labels for k in EXCLUDED_NODE_LABELS), cpu_milli=-1,
                    proxy_version=node_proxy_version(status))


def slice_owner(obj: Any) -> tuple[str, str]:
    """(namespace, ``kubernetes.io/service-name`` label) of a slice, read leniently."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ("", "")
    labels = meta.get("labels")
    ns = meta.get("namespace", "default")
    name = labels.get(LABEL_SERVICE_NAME) if isinstance(labels, dict) else None
    return (ns if isinstance(ns, str) else "", name if isinstance(name, str) else "")


# ------------------------------------------------------------------ hint-model entries
# What the cache keeps per object for the hint model: the record, or the InputError that
# parsing raised (reported by each evaluation, as evaluate_cluster reports bad input).

#: a Node: its NodeInfo, or (on error) what :func:`unreadable_node` could read, and the error
NodeEntry = tuple["NodeInfo | None", "InputError | None"]
#: a Service: its ServiceInfo, or None and the error
ServiceEntry = tuple["ServiceInfo | None", "InputError | None"]
#: an EndpointSlice: (namespace, ``kubernetes.io/service-name``, Slice or None, error)
SliceEntry = tuple[str, str, "Slice | None", "InputError | None"]


def parse_node_entry(obj: Any) -> NodeEntry:
    """:func:`parse_node_info`, errors kept as data."""
    try:
        return parse_node_info(obj), None
    except InputError as err:
        return unreadable_node(obj), err


def parse_service_entry(obj: Any) -> ServiceEntry:
    """:func:`parse_service_info`, errors kept as data."""
    try:
        return parse_service_info(obj), None
    except InputError as err:
        return None, err


def parse_slice_entry(obj: Any) -> SliceEntry:
    """:func:`parse_slice`, errors kept as data (namespace and service then read leniently)."""
    try:
        ns, name, sl = parse_slice(obj)
        return ns, name, sl, None
    except InputError as err:
        ns, name = slice_owner(obj)
        return ns, name, None, err


def entry_key(entry: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """A comparable form of an entry (errors compare by their message)."""
    if entry is None:
        return None
    return tuple(str(x) if isinstance(x, InputError) else x for x in entry)
