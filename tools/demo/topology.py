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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.errors import InputError
from tools.lab.topology import Service, Topology

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

_KEYS = {"clients", "services", "rate", "requestBytes", "responseBytes", "family"}


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
    """

    clients: tuple[str, ...]
    services: tuple[str, ...]
    rate: float
    request_bytes: int
    response_bytes: int
    families: tuple[int, ...]


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
    rate = float(_number(raw.get("rate", 4), source, "rate", 0.1, 200, integer=False))
    req = int(_number(raw.get("requestBytes", 400), source, "requestBytes", 8, 10**7, True))
    resp = int(_number(raw.get("responseBytes", 4000), source, "responseBytes", 0, 10**7, True))
    fam = raw.get("family", 4)
    families = {4: (4,), 6: (6,), "4": (4,), "6": (6,), "both": (4, 6)}.get(fam)
    if families is None:
        raise _fail(f"must be 4, 6 or both, got {fam!r}", source, "family")
    if 6 in families and not topo.options.ipv6:
        raise _fail("IPv6 traffic needs options.ipv6: true", source, "family")
    return TrafficPlan(clients=tuple(clients), services=tuple(services), rate=rate,
                       request_bytes=req, response_bytes=resp, families=families)


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

