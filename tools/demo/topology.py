"""The demo's cluster description: a lab topology plus a traffic plan.

A demo file is a lab topology (the YAML of :mod:`tools.lab.topology`, see docs/lab.md) with
one extra, optional top-level section, ``traffic``::

    traffic:
      clients: {app: frontend}   # label selector of the client pods (default: app=frontend,
                                 # or every pod without ports when no pod has that label)
      services: [shop/catalog]   # Services every client calls (default: all)
      rate: 4                    # requests per second, per client and Service
      requestBytes: 400          # application bytes per request (>= 8)
      responseBytes: 4000        # application bytes per response
      family: 4                  # 4, 6 or both (6 needs options.ipv6)

Every client calls every listed Service on the Service's first TCP port (one TCP
connection per request, so every request gets a fresh DNAT choice), at the same rate and
sizes: the issue-5 matrix. :data:`DEFAULT_DEMO_TOPOLOGY` is the embedded default.

``flows`` lists further traffic, one path each (docs/demo.md, "Every path")::

    traffic:
      flows:
        - from: {app: mesh}                  # pod names (a string or a list), a label
                                             # selector, or outside peers: outside/lb-a
          to: {service: shop/checkout, via: endpoints}
          rate: 4                            # per client; sizes and family as above
        - {from: outside/lb-c, to: {service: shop/web, via: nodePort, nodes: [c2]}}
        - {from: outside/lb-a, to: {node: a1, port: 443}}     # a host-network server
        - {from: frontend-a1, to: {pod: batch-b1}}           # pod to pod, no Service
        - {from: frontend-a1, to: {hostPort: cache-b1}}      # node address, hostPort
        - {from: frontend-b1, to: {outside: orders-db}}      # a managed database

``to`` names exactly one of ``service`` (``via``: ``clusterIP``, the default; ``endpoints``, a
client that balances itself over the Service's endpoints, the only way to a headless
Service; ``nodePort``, the nodes' addresses, ``nodes`` or every node), ``pod`` (its address),
``hostPort`` (its node's address and the pod's first TCP hostPort), ``node`` (with ``port``:
a host-network pod there serves it) or ``outside`` (a peer that serves a port). With
``flows`` the matrix plays only when ``services`` is given. A client with several
destinations sends round robin (``tools/lab/traffic.py``), one process per client, flow and
family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.errors import InputError
from tools.lab.topology import Pod, Service, Topology, resolve_target_port

#: the demo's default cluster (docs/demo.md): three zones, two 4-CPU nodes each, a frontend client on every
#: node, five Services in namespace shop with the locality settings users get wrong, and
#: node c2 whose data plane ignores hints.
DEFAULT_DEMO_TOPOLOGY = """\
options: {mode: flat, ipv6: false}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
  - {name: zone-c, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: a2, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
  - {name: b2, zone: zone-b, cpu: 4}
  - {name: c1, zone: zone-c, cpu: 4}
  - {name: c2, zone: zone-c, cpu: 4, ignoreHints: true}
pods:
  # clients: one frontend per node
  - {name: frontend-a1, namespace: shop, node: a1, app: frontend}
  - {name: frontend-a2, namespace: shop, node: a2, app: frontend}
  - {name: frontend-b1, namespace: shop, node: b1, app: frontend}
  - {name: frontend-b2, namespace: shop, node: b2, app: frontend}
  - {name: frontend-c1, namespace: shop, node: c1, app: frontend}
  - {name: frontend-c2, namespace: shop, node: c2, app: frontend}
  # catalog: one endpoint per node, no locality settings
  - {name: catalog-a1, namespace: shop, node: a1, app: catalog, ports: [{port: 8080, name: http}]}
  - {name: catalog-a2, namespace: shop, node: a2, app: catalog, ports: [{port: 8080, name: http}]}
  - {name: catalog-b1, namespace: shop, node: b1, app: catalog, ports: [{port: 8080, name: http}]}
  - {name: catalog-b2, namespace: shop, node: b2, app: catalog, ports: [{port: 8080, name: http}]}
  - {name: catalog-c1, namespace: shop, node: c1, app: catalog, ports: [{port: 8080, name: http}]}
  - {name: catalog-c2, namespace: shop, node: c2, app: catalog, ports: [{port: 8080, name: http}]}
  # cart: 8 endpoints (Auto refuses 8 in three equal zones)
  - {name: cart-1, namespace: shop, node: a1, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-2, namespace: shop, node: a2, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-3, namespace: shop, node: b1, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-4, namespace: shop, node: b2, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-5, namespace: shop, node: c1, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-6, namespace: shop, node: c2, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-7, namespace: shop, node: a1, app: cart, ports: [{port: 8080, name: http}]}
  - {name: cart-8, namespace: shop, node: b1, app: cart, ports: [{port: 8080, name: http}]}
  # checkout: one endpoint per node, PreferSameZone
  - {name: checkout-a1, namespace: shop, node: a1, app: checkout, ports: [{port: 8080, name: http}]}
  - {name: checkout-a2, namespace: shop, node: a2, app: checkout, ports: [{port: 8080, name: http}]}
  - {name: checkout-b1, namespace: shop, node: b1, app: checkout, ports: [{port: 8080, name: http}]}
  - {name: checkout-b2, namespace: shop, node: b2, app: checkout, ports: [{port: 8080, name: http}]}
  - {name: checkout-c1, namespace: shop, node: c1, app: checkout, ports: [{port: 8080, name: http}]}
  - {name: checkout-c2, namespace: shop, node: c2, app: checkout, ports: [{port: 8080, name: http}]}
  # node-cache: one endpoint per node, PreferSameNode
  - {name: node-cache-a1, namespace: shop, node: a1, app: node-cache, ports: [{port: 8080, name: http}]}
  - {name: node-cache-a2, namespace: shop, node: a2, app: node-cache, ports: [{port: 8080, name: http}]}
  - {name: node-cache-b1, namespace: shop, node: b1, app: node-cache, ports: [{port: 8080, name: http}]}
  - {name: node-cache-b2, namespace: shop, node: b2, app: node-cache, ports: [{port: 8080, name: http}]}
  - {name: node-cache-c1, namespace: shop, node: c1, app: node-cache, ports: [{port: 8080, name: http}]}
  - {name: node-cache-c2, namespace: shop, node: c2, app: node-cache, ports: [{port: 8080, name: http}]}
  # payments: 4 endpoints, Auto and PreferSameZone together (Auto shadows the field, refuses)
  - {name: payments-1, namespace: shop, node: a1, app: payments, ports: [{port: 8080, name: http}]}
  - {name: payments-2, namespace: shop, node: b1, app: payments, ports: [{port: 8080, name: http}]}
  - {name: payments-3, namespace: shop, node: c1, app: payments, ports: [{port: 8080, name: http}]}
  - {name: payments-4, namespace: shop, node: a2, app: payments, ports: [{port: 8080, name: http}]}
services:
  - name: catalog
    namespace: shop
    selector: {app: catalog}
    ports: [{name: http, port: 80, targetPort: http}]
  - name: cart
    namespace: shop
    selector: {app: cart}
    annotations: {service.kubernetes.io/topology-mode: Auto}
    ports: [{name: http, port: 80, targetPort: http}]
  - name: checkout
    namespace: shop
    selector: {app: checkout}
    trafficDistribution: PreferSameZone
    ports: [{name: http, port: 80, targetPort: http}]
  - name: node-cache
    namespace: shop
    selector: {app: node-cache}
    trafficDistribution: PreferSameNode
    ports: [{name: http, port: 80, targetPort: http}]
  - name: payments
    namespace: shop
    selector: {app: payments}
    annotations: {service.kubernetes.io/topology-mode: Auto}
    trafficDistribution: PreferSameZone
    ports: [{name: http, port: 80, targetPort: http}]
traffic:
  clients: {app: frontend}
  rate: 4
  requestBytes: 400
  responseBytes: 4000
  family: 4
"""

#: the smallest three-zone demo: one web client and one ``app/api`` endpoint per zone, no
#: locality settings (the tests flip them: tests/unit/demo/test_flip.py,
#: tests/e2e/test_report_live.py)
THREE_ZONE_API_TOPOLOGY = """\
zones: [{name: za}, {name: zb}, {name: zc}]
nodes:
  - {name: n1, zone: za, cpu: 2}
  - {name: n2, zone: zb, cpu: 2}
  - {name: n3, zone: zc, cpu: 2}
pods:
  - {name: web-1, namespace: app, node: n1, app: web}
  - {name: web-2, namespace: app, node: n2, app: web}
  - {name: web-3, namespace: app, node: n3, app: web}
  - {name: api-1, namespace: app, node: n1, app: api, ports: [{port: 8080}]}
  - {name: api-2, namespace: app, node: n2, app: api, ports: [{port: 8080}]}
  - {name: api-3, namespace: app, node: n3, app: api, ports: [{port: 8080}]}
services:
  - {name: api, namespace: app, selector: {app: api}, ports: [{port: 80, targetPort: 8080}]}
traffic: {clients: {app: web}, rate: 20, requestBytes: 300, responseBytes: 3000, family: 4}
"""

_KEYS = {"clients", "services", "rate", "requestBytes", "responseBytes", "family", "flows"}
_FLOW_KEYS = {"from", "to", "rate", "requestBytes", "responseBytes", "family"}
_TO_KINDS = ("service", "pod", "hostPort", "node", "outside")
#: how a ``service`` flow reaches the Service
VIAS = ("clusterIP", "endpoints", "nodePort")
#: every path a flow can take (:attr:`FlowPlan.path`)
PATHS = ("clusterIP", "endpoints", "nodePort", "pod", "hostPort", "node", "outside")


@dataclass(frozen=True, slots=True)
class FlowPlan:
    """One entry of the traffic plan: clients, one path, its rate and sizes.

    Attributes:
        name: ``matrix`` for the ``clients`` x ``services`` matrix, else ``flows[i]``.
        clients: client pod names, or ``outside/<peer>`` names, in topology order.
        path: one of :data:`PATHS`: ``clusterIP`` (the Service's ClusterIP), ``endpoints``
            (the Service's endpoint addresses round robin: a client that balances itself),
            ``nodePort`` (the nodes' addresses at the Service's node port), ``pod``
            (a pod's address), ``hostPort`` (a pod's node's address at its hostPort),
            ``node`` (a node's address, a host-network pod serving the port), ``outside``
            (an outside peer's address).
        service: the Service key for the first three paths, else None.
        target: the pod, node or peer named by ``to`` (None for Service paths).
        servers: the ground truth's server names the flow reaches (pods, or
            ``outside/<peer>``).
        port: the destination port (host byte order); None for ``nodePort`` when the
            topology gives no ``nodePort`` (the real apiserver allocates it:
            ``Lab.node_port``).
        nodes: the nodes a ``nodePort``/``node``/``hostPort`` flow sends to.
        rate: requests per second per client and family (one TCP connection each).
        request_bytes, response_bytes: application bytes per request and response.
        families: ``(4,)``, ``(6,)`` or ``(4, 6)``.
    """

    name: str
    clients: tuple[str, ...]
    path: str
    service: str | None
    target: str | None
    servers: tuple[str, ...]
    port: int | None
    nodes: tuple[str, ...]
    rate: float
    request_bytes: int
    response_bytes: int
    families: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TrafficPlan:
    """Who calls what, how often and how big (the issue-5 traffic matrix).

    Attributes:
        clients: client pod names, in topology order.
        services: ``namespace/name`` keys every client calls, in topology order.
        rate: requests per second per (client, Service); each request is one TCP connection.
        request_bytes: application bytes per request (payload, no headers).
        response_bytes: application bytes per response (payload, no headers).
        families: address families of the ClusterIPs called: ``(4,)``, ``(6,)`` or ``(4, 6)``
            (with both, each family gets ``rate``).
        flows: every flow of the plan, the matrix's first (one :class:`FlowPlan` per Service
            it calls), then ``flows`` in order.
    """

    clients: tuple[str, ...]
    services: tuple[str, ...]
    rate: float
    request_bytes: int
    response_bytes: int
    families: tuple[int, ...]
    flows: tuple[FlowPlan, ...] = ()


@dataclass(frozen=True, slots=True)
class DemoSpec:
    """A lab topology and the traffic to run on it."""

    topology: Topology
    traffic: TrafficPlan


def _fail(problem: str, source: str, fld: str) -> InputError:
    return InputError(problem, source=source, obj="traffic", field=fld)


def _number(value: Any, source: str, fld: str, lo: float, hi: float, integer: bool) -> Any:
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise _fail(f"must be {kind} in {lo:g}..{hi:g}, got {value!r}", source, fld)
    return value


def service_port(svc: Service) -> int:
    """Return the Service port the demo's clients call: its first TCP port.

    Raises:
        InputError: the Service has no TCP port.
    """
    for sp in svc.ports:
        if sp.protocol == "TCP":
            return sp.port
    raise InputError("the demo calls a Service on a TCP port and this one has none",
                     obj=f"Service {svc.key}", field="ports")


def parse_traffic(raw: Any, topo: Topology, source: str = "<memory>") -> TrafficPlan:
    """Validate a ``traffic`` section against its topology.

    Raises:
        InputError: naming ``traffic`` and the field (unknown client selector, Service
            without a TCP port, a pod that backs two Services, IPv6 without ``ipv6``...).
    """
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise _fail(f"must be a mapping, got {type(raw).__name__}", source, "traffic")
    for key in raw:
        if key not in _KEYS:
            raise _fail(f"unknown field (allowed: {', '.join(sorted(_KEYS))})", source, str(key))
    rate = float(_number(raw.get("rate", 4), source, "rate", 0.1, 200, integer=False))
    req = int(_number(raw.get("requestBytes", 400), source, "requestBytes", 8, 10**7, True))
    resp = int(_number(raw.get("responseBytes", 4000), source, "responseBytes", 0, 10**7, True))
    families = _families(raw.get("family", 4), topo, source, "family")
    if "flows" in raw and "services" not in raw:
        if "clients" in raw:
            raise _fail("with flows, the matrix plays only when services lists what clients call",
                        source, "clients")
        flows = _parse_flows(raw["flows"], topo, source, rate, req, resp, families)
        _check_plan(flows, topo, source)
        return TrafficPlan(clients=(), services=(), rate=rate, request_bytes=req,
                           response_bytes=resp, families=families, flows=tuple(flows))
    selector = raw.get("clients")
    if selector is None:
        clients = [p.name for p in topo.pods if p.labels.get("app") == "frontend"] or \
            [p.name for p in topo.pods if not p.ports]
    else:
        if not isinstance(selector, dict) or not selector or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
            raise _fail("must be a non-empty label selector (a mapping of strings)", source,
                        "clients")
        clients = [p.name for p in topo.pods
                   if all(p.labels.get(k) == v for k, v in selector.items())]
    if not clients:
        raise _fail("selects no pod", source, "clients")
    wanted = raw.get("services")
    if wanted is None:
        services = [s.key for s in topo.services]
    else:
        if not isinstance(wanted, list) or not wanted:
            raise _fail("must be a non-empty list of namespace/name", source, "services")
        services = []
        for i, key in enumerate(wanted):
            if not isinstance(key, str):
                raise _fail(f"must be a string, got {key!r}", source, f"services[{i}]")
            try:
                services.append(topo.service(key).key)
            except InputError as err:
                raise _fail(err.problem, source, f"services[{i}]") from None
    owner: dict[str, str] = {}
    for key in services:
        svc = topo.service(key)
        service_port(svc)
        if not svc.endpoints:
            raise _fail(f"Service {key} has no endpoint pods", source, "services")
        for ep in svc.endpoints:
            # the lab's ground truth is per (client pod, server pod): a pod backing two
            # called Services would make per-Service truth ambiguous
            if ep in owner and owner[ep] != key:
                raise _fail(f"pod {ep} backs both {owner[ep]} and {key}; the demo's ground "
                            "truth needs one Service per server pod", source, "services")
            owner[ep] = key
        for c in clients:
            if c in svc.endpoints:
                raise _fail(f"client {c} is an endpoint of {key} (the lab has no hairpin)",
                            source, "clients")
        if svc.headless:
            raise _fail(f"Service {key} is headless (clusterIP: None): call it with a flow "
                        "via endpoints", source, "services")
    flows = [FlowPlan(name="matrix", clients=tuple(clients), path="clusterIP", service=key,
                      target=None, servers=topo.service(key).endpoints,
                      port=service_port(topo.service(key)), nodes=(), rate=rate,
                      request_bytes=req, response_bytes=resp, families=families)
             for key in services]
    if "flows" in raw:
        flows += _parse_flows(raw["flows"], topo, source, rate, req, resp, families)
    _check_plan(flows, topo, source)
    return TrafficPlan(clients=tuple(clients), services=tuple(services), rate=rate,
                       request_bytes=req, response_bytes=resp, families=families,
                       flows=tuple(flows))


def _families(fam: Any, topo: Topology, source: str, fld: str) -> tuple[int, ...]:
    families = {4: (4,), 6: (6,), "4": (4,), "6": (6,), "both": (4, 6)}.get(fam)
    if families is None:
        raise _fail(f"must be 4, 6 or both, got {fam!r}", source, fld)
    if 6 in families and not topo.options.ipv6:
        raise _fail("IPv6 traffic needs options.ipv6: true", source, fld)
    return families


def _first_tcp(ports: Any, what: str, source: str, fld: str) -> Any:
    for pp in ports:
        if pp.protocol == "TCP":
            return pp
    raise _fail(f"{what} has no TCP port (the demo's clients speak TCP)", source, fld)


def _clients(value: Any, topo: Topology, source: str, fld: str) -> tuple[str, ...]:
    """``from``: a pod or peer name, a list of them, or a label selector of pods."""
    if isinstance(value, Mapping):
        if not value or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise _fail("must be a non-empty label selector (a mapping of strings)", source, fld)
        found = tuple(p.name for p in topo.pods if all(p.labels.get(k) == v for k, v in value.items()))
        if not found:
            raise _fail("selects no pod", source, fld)
        return found
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise _fail("must be a pod or outside peer name, a list of them, or a label selector",
                    source, fld)
    out = []
    for i, n in enumerate(names):
        where = fld if isinstance(value, str) else f"{fld}[{i}]"
        if not isinstance(n, str):
            raise _fail(f"must be a name, got {n!r}", source, where)
        if n.startswith("outside/"):
            try:
                out.append(topo.peer(n).key)
            except InputError:
                raise _fail(f"no outside peer {n.removeprefix('outside/')!r} in the topology",
                            source, where) from None
        elif any(p.name == n for p in topo.pods):
            out.append(n)
        else:
            raise _fail(f"no pod {n!r} (an outside peer is written outside/<name>)", source, where)
    return tuple(out)


def _parse_flows(raw: Any, topo: Topology, source: str, rate: float, req: int, resp: int,
                 families: tuple[int, ...]) -> list[FlowPlan]:
    if not isinstance(raw, list) or not raw:
        raise _fail("must be a non-empty list of flows", source, "flows")
    out = []
    for i, item in enumerate(raw):
        name = f"flows[{i}]"
        if not isinstance(item, Mapping):
            raise _fail(f"must be a mapping, got {type(item).__name__}", source, name)
        for key in item:
            if key not in _FLOW_KEYS:
                raise _fail(f"unknown field (allowed: {', '.join(sorted(_FLOW_KEYS))})", source,
                            f"{name}.{key}")
        if "from" not in item:
            raise _fail("missing: who sends (pod names, a label selector or outside/<peer>)",
                        source, f"{name}.from")
        clients = _clients(item["from"], topo, source, f"{name}.from")
        out.append(_flow(name, clients, item.get("to"), topo, source,
                         float(_number(item.get("rate", rate), source, f"{name}.rate", 0.1, 200, False)),
                         int(_number(item.get("requestBytes", req), source, f"{name}.requestBytes",
                                     8, 10**7, True)),
                         int(_number(item.get("responseBytes", resp), source, f"{name}.responseBytes",
                                     0, 10**7, True)),
                         _families(item["family"], topo, source, f"{name}.family")
                         if "family" in item else families))
    return out


def _flow(name: str, clients: tuple[str, ...], to: Any, topo: Topology, source: str, rate: float,
          req: int, resp: int, families: tuple[int, ...]) -> FlowPlan:
    fld = f"{name}.to"
    if not isinstance(to, Mapping):
        raise _fail(f"must be a mapping with one of {', '.join(_TO_KINDS)}", source, fld)
    kinds = [k for k in _TO_KINDS if k in to]
    if len(kinds) != 1:
        raise _fail(f"give exactly one of {', '.join(_TO_KINDS)}", source, fld)
    kind = kinds[0]
    allowed = {kind, *({"via", "nodes"} if kind == "service" else {"port"} if kind == "node" else ())}
    for key in to:
        if key not in allowed:
            raise _fail(f"unknown field (allowed here: {', '.join(sorted(allowed))})", source,
                        f"{fld}.{key}")
    outside = [c for c in clients if c.startswith("outside/")]
    plan = dict(name=name, clients=clients, rate=rate, request_bytes=req, response_bytes=resp,
                families=families)

    def pod_of(value: Any, key: str) -> Pod:
        try:
            return topo.pod(str(value))
        except InputError:
            raise _fail(f"no pod {value!r}", source, f"{fld}.{key}") from None

    if kind == "service":
        try:
            svc = topo.service(str(to["service"]))
        except InputError as err:
            raise _fail(err.problem, source, f"{fld}.service") from None
        via = to.get("via", "clusterIP")
        if via not in VIAS:
            raise _fail(f"must be one of {', '.join(VIAS)}, got {via!r}", source, f"{fld}.via")
        if "nodes" in to and via != "nodePort":
            raise _fail("only a nodePort flow chooses nodes", source, f"{fld}.nodes")
        if not svc.endpoints:
            raise _fail(f"Service {svc.key} has no endpoint pods", source, f"{fld}.service")
        sp = _first_tcp(svc.ports, f"Service {svc.key}", source, f"{fld}.service")
        nodes: tuple[str, ...] = ()
        port: int | None
        if via == "clusterIP":
            if svc.headless:
                raise _fail(f"Service {svc.key} is headless (clusterIP: None): its clients dial the "
                            "endpoints (via: endpoints)", source, f"{fld}.via")
            if outside:
                raise _fail(f"{outside[0]} is outside the cluster and has no route to ClusterIPs "
                            "(via nodePort or endpoints)", source, f"{fld}.via")
            port = sp.port
        elif via == "endpoints":
            ports = {resolve_target_port(topo.pod(e), sp) for e in svc.endpoints}
            if len(ports) != 1:
                raise _fail(f"the endpoints of Service {svc.key} serve {sp.port} on different "
                            f"ports {sorted(ports)}; a self-balancing client dials one port",
                            source, f"{fld}.via")
            port = ports.pop()
        else:
            if not svc.node_ports:
                raise _fail(f"Service {svc.key} is of type {svc.type}: no node ports (type NodePort "
                            "or LoadBalancer)", source, f"{fld}.via")
            port = sp.node_port
            raw_nodes = to.get("nodes")
            if raw_nodes is None:
                nodes = tuple(n.name for n in topo.nodes)
            else:
                if not isinstance(raw_nodes, list) or not raw_nodes:
                    raise _fail("must be a non-empty list of node names", source, f"{fld}.nodes")
                for j, n in enumerate(raw_nodes):
                    if not any(x.name == n for x in topo.nodes):
                        raise _fail(f"no node {n!r}", source, f"{fld}.nodes[{j}]")
                nodes = tuple(raw_nodes)
            if svc.external_traffic_policy == "Local":
                for n in nodes:
                    if not any(topo.pod(e).node == n for e in svc.endpoints):
                        raise _fail(f"node {n} has no endpoint of Service {svc.key}, whose "
                                    "externalTrafficPolicy Local drops node-port traffic there",
                                    source, f"{fld}.nodes")
        return FlowPlan(path=via, service=svc.key, target=None, servers=svc.endpoints, port=port,
                        nodes=nodes, **plan)  # type: ignore[arg-type]
    if kind == "pod" or kind == "hostPort":
        pod = pod_of(to[kind], kind)
        if kind == "pod":
            pp = _first_tcp(pod.ports, f"pod {pod.name}", source, f"{fld}.pod")
            return FlowPlan(path="pod", service=None, target=pod.name, servers=(pod.name,),
                            port=pp.port, nodes=(), **plan)  # type: ignore[arg-type]
        if pod.host_network:
            raise _fail(f"pod {pod.name} is host-network: call its node (to: node, port)", source,
                        f"{fld}.hostPort")
        hp = next((q for q in pod.ports if q.protocol == "TCP" and q.host_port is not None), None)
        if hp is None:
            raise _fail(f"pod {pod.name} has no TCP port with a hostPort", source, f"{fld}.hostPort")
        return FlowPlan(path="hostPort", service=None, target=pod.name, servers=(pod.name,),
                        port=hp.host_port, nodes=(pod.node,), **plan)  # type: ignore[arg-type]
    if kind == "node":
        node = str(to["node"])
        if not any(n.name == node for n in topo.nodes):
            raise _fail(f"no node {node!r}", source, f"{fld}.node")
        if "port" not in to:
            raise _fail("missing: the port a host-network pod on the node serves", source, f"{fld}.port")
        port_n = to["port"]
        servers = [p for p in topo.pods_on(node) if p.host_network
                   and any(q.port == port_n and q.protocol == "TCP" for q in p.ports)]
        if not servers:
            raise _fail(f"no host-network pod on node {node} serves TCP port {port_n!r} (the lab "
                        "counts only declared server ports)", source, f"{fld}.port")
        return FlowPlan(path="node", service=None, target=node, servers=(servers[0].name,),
                        port=int(port_n), nodes=(node,), **plan)  # type: ignore[arg-type]
    try:
        peer = topo.peer(str(to["outside"]))
    except InputError:
        raise _fail(f"no outside peer {to['outside']!r}", source, f"{fld}.outside") from None
    if outside:
        raise _fail(f"{outside[0]} and {peer.key} are both outside the cluster: nothing in the "
                    "cluster sees their traffic", source, f"{fld}.outside")
    pp = _first_tcp(peer.ports, f"outside peer {peer.name}", source, f"{fld}.outside")
    return FlowPlan(path="outside", service=None, target=peer.key, servers=(peer.key,), port=pp.port,
                    nodes=(), **plan)  # type: ignore[arg-type]


def observed_client(topo: Topology, plan: FlowPlan, client: str, node: str | None = None) -> str:
    """The client name the lab's ground truth records for ``client`` on this flow (what the
    server sees): the pod itself; a NodePort call with ``externalTrafficPolicy: Cluster`` is
    masqueraded to the receiving ``node``'s address, which the ground truth names after the
    node's only host-network pod, else ``node/<name>`` (``Lab.client_name``); a host-network
    pod is its node's address alike."""
    if plan.path == "nodePort" and node is not None and plan.service is not None \
            and topo.service(plan.service).external_traffic_policy == "Cluster":
        return node_address_name(topo, node)
    if client.startswith("outside/"):
        return client
    pod = topo.pod(client)
    return node_address_name(topo, pod.node) if pod.host_network else pod.name


def node_address_name(topo: Topology, node: str) -> str:
    """How the lab's ground truth names a client at ``node``'s address (``Lab.client_name``)."""
    host = [p.name for p in topo.pods_on(node) if p.host_network]
    return host[0] if len(host) == 1 else f"node/{node}"


def _check_plan(flows: list[FlowPlan], topo: Topology, source: str) -> None:
    """Plan-wide rules the ground truth needs: a server pod backs at most one Service the plan
    reaches and is called on that Service's port; no client calls itself; two flows that reach
    one server from one observed client take the same path (the ground truth is per client and
    server, so it could not tell them apart)."""
    owner: dict[str, str] = {}
    for f in flows:
        for key in ([f.service] if f.service else []):
            for ep in topo.service(key).endpoints:
                # the lab's ground truth is per (client pod, server pod): a pod backing two
                # reached Services would make per-Service truth ambiguous
                if ep in owner and owner[ep] != key:
                    raise _fail(f"pod {ep} backs both {owner[ep]} and {key}; the demo's ground "
                                "truth needs one Service per server pod", source,
                                "services" if f.name == "matrix" else f"{f.name}.to")
                owner[ep] = key
    for f in flows:
        if f.path not in ("pod", "hostPort"):
            continue
        backing = [s for s in topo.services if f.servers[0] in s.endpoints]
        for svc in backing:
            pod = topo.pod(f.servers[0])
            want = {resolve_target_port(pod, sp) for sp in svc.ports}
            port = next(q.port for q in pod.ports if q.protocol == "TCP" and
                        (f.path == "pod" or q.host_port == f.port))
            if port not in want:
                raise _fail(f"pod {pod.name} backs Service {svc.key} on {sorted(want)}; the lab's "
                            "ground truth is per pod, not per port, so call it there", source,
                            f"{f.name}.to")
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for f in flows:
        for c in f.clients:
            if c in f.servers:
                raise _fail(f"client {c} is one of the flow's servers (the lab has no hairpin)",
                            source, "clients" if f.name == "matrix" else f"{f.name}.from")
            for n in (f.nodes or (None,)):
                seen_as = observed_client(topo, f, c, n)
                for server in f.servers:
                    meaning = _meaning(topo, f, seen_as)
                    prev = seen.setdefault((seen_as, server), (meaning, f.name))
                    if prev[0] != meaning:
                        raise _fail(f"{seen_as} reaches {server} by {prev[1]} and by {f.name} on "
                                    "paths the ground truth cannot tell apart (it is per client and "
                                    "server); use other clients", source, f"{f.name}.from")


def _meaning(topo: Topology, f: FlowPlan, seen_as: str) -> str:
    """What the ground truth must say about a (client, server) pair of ``f``: the client's
    class, and the cause if its bytes ignore the hints."""
    if seen_as.startswith("outside/") or seen_as.startswith("node/") or \
            topo.pod(seen_as).host_network:
        return "as-addressed"
    return "data-plane" if f.path == "clusterIP" else "client-side"


def parse_demo(text: str, source: str = "<yaml>", *, mode: str | None = None,
               ipv6: bool | None = None) -> DemoSpec:
    """Parse a demo file's text: the lab topology plus its ``traffic`` section.

    Args:
        text: YAML.
        source: file name for error messages.
        mode: override ``options.mode`` (``flat`` or ``vxlan``).
        ipv6: override ``options.ipv6``; True also makes the traffic section's ``family`` 4
            (the default) ``both``, so the dual-stack lab is exercised in both families.

    Raises:
        InputError: invalid YAML, topology or traffic (naming file, object and field).
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InputError(f"invalid YAML: {getattr(err, 'problem', err)}", source=source,
                         obj=f"line {mark.line + 1}" if mark else None) from None
    if not isinstance(data, dict):
        raise InputError("must be a mapping (a lab topology)", source=source, obj="topology")
    data = dict(data)
    traffic = data.pop("traffic", None)
    options = dict(data.get("options") or {})
    if mode is not None:
        options["mode"] = mode
    if ipv6 is not None:
        options["ipv6"] = ipv6
        if ipv6 and isinstance(traffic, dict) and traffic.get("family", 4) in (4, "4"):
            # a dual-stack lab asked for on the command line is exercised in both families
            # (a traffic section that asks for IPv6 only keeps it)
            traffic = {**traffic, "family": "both"}
        elif ipv6 and traffic is None:
            traffic = {"family": "both"}
    data["options"] = options
    try:
        topo = Topology.from_dict(data, source=source)
    except InputError as err:
        raise err.with_source(source) from None
    return DemoSpec(topo, parse_traffic(traffic, topo, source))


def load_demo(path: str | Path | None = None, **overrides: Any) -> DemoSpec:
    """Read a demo file (``None``: :data:`DEFAULT_DEMO_TOPOLOGY`); see :func:`parse_demo`.

    Raises:
        InputError: unreadable or invalid file.
    """
    if path is None:
        return parse_demo(DEFAULT_DEMO_TOPOLOGY, "<default demo topology>", **overrides)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", source=str(path)) from None
    return parse_demo(text, str(path), **overrides)

