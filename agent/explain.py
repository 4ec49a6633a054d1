"""``zonemeter explain`` and ``zonemeter what-if``: why traffic does or does not stay in its zone.

explain reads a ``kubectl get nodes,services,endpointslices,pods -A -o json`` (or ``-o yaml``,
or multi-document YAML) dump, or lists a live cluster, and prints per Service what the
EndpointSlice controller would write, what kube-proxy on each node does, and one reason.

what-if answers "how many replicas does topology-mode Auto accept?" for zones of given CPU.

Examples:
    zonemeter explain --snapshot dump.json
    zonemeter explain --snapshot dump.yaml --service shop/cart --node worker-3 -o json
    zonemeter explain --kubeconfig ~/.kube/config --kubernetes-version 1.31
    zonemeter what-if --zone a=4 --zone b=4 --zone c=4 --replicas 3-12
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from agent import hints
from agent.errors import InputError

_EPILOG_EXPLAIN = """examples:
  zonemeter explain --snapshot dump.json
  zonemeter explain --snapshot dump.yaml --service shop/cart --node worker-3 -o json
  zonemeter explain --kubeconfig ~/.kube/config --kubernetes-version 1.31 \\
      --feature-gates PreferSameTrafficDistribution=true
dump with: kubectl get nodes,services,endpointslices,pods -A -o json > dump.json
"""

_EPILOG_WHATIF = """examples:
  zonemeter what-if --zone a=4 --zone b=4 --zone c=4 --replicas 3-12
  zonemeter what-if --zone a=20 --zone b=16 --zone c=14 --replicas 3-10 --spread a=2,b=1,c=1
"""


def register(subparsers: Any) -> None:
    """Add the ``explain`` and ``what-if`` verbs."""
    p = subparsers.add_parser(
        "explain", help="explain topology-aware routing per Service",
        description="Explain, per Service, whether topology-aware routing keeps ClusterIP traffic "
        "in its zone, reproducing the EndpointSlice controller and kube-proxy (1.27-1.35).",
        epilog=_EPILOG_EXPLAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--snapshot", metavar="FILE", help="kubectl JSON/YAML dump to read")
    src.add_argument("--kubeconfig", metavar="FILE",
                     help="list a live cluster with this kubeconfig (default: in-cluster config)")
    p.add_argument("--context", help="kubeconfig context (with --kubeconfig)")
    p.add_argument("--service", metavar="NS/NAME", help="only this Service")
    p.add_argument("--node", metavar="NODE", help="only this node in the proxy view")
    p.add_argument("--kubernetes-version", default=hints.DEFAULT_VERSION, metavar="X.Y",
                   help="version to model, 1.27 to 1.35 (default %(default)s)")
    p.add_argument("--feature-gates", default="", metavar="NAME=BOOL,...",
                   help="feature gate overrides, e.g. PreferSameTrafficDistribution=false")
    p.add_argument("--hints-populated", metavar="NS/NAME,...", default=None,
                   help="Services the controller's topology cache already marks as having Auto "
                   "hints (controls Enabled/Disabled events; default: inferred from the slices)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=run_explain)

    w = subparsers.add_parser(
        "what-if", help="which replica counts topology-mode Auto accepts",
        description="For each replica count, whether topology-mode Auto assigns hints in zones "
        "of the given allocatable CPU, why not, the per-zone minimums and hints per zone.",
        epilog=_EPILOG_WHATIF, formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--zone", action="append", required=True, metavar="ZONE=CPU",
                   help="a zone and its allocatable CPU (Kubernetes quantity); repeat per zone")
    w.add_argument("--replicas", required=True, metavar="A-B", help="replica counts, e.g. 3-12 or 6")
    w.add_argument("--spread", metavar="ZONE=N,...",
                   help="placement cycle: N endpoints in each zone per round (default 1 each, "
                   "round-robin in zone order)")
    w.add_argument("-o", "--output", choices=("table", "json"), default="table")
    w.set_defaults(func=run_what_if)


# ---------------------------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------------------------


def parse_feature_gates(text: str) -> dict[str, bool]:
    """Parse ``Name=true,Other=false``.

    Raises:
        InputError: malformed pair or value.
    """
    gates: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or value.strip().lower() not in ("true", "false"):
            raise InputError(f"expected Name=true|false, got {part!r}", field="--feature-gates")
        gates[name.strip()] = value.strip().lower() == "true"
    return gates


def _split_service(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name:
        raise InputError(f"expected NAMESPACE/NAME, got {text!r}", field="--service")
    return ns, name


def _has_selector(obj: dict[str, Any]) -> bool:
    spec: dict[str, Any] = obj["spec"] if isinstance(obj.get("spec"), dict) else {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


def _slice_service(obj: dict[str, Any]) -> tuple[str, str]:
    meta: dict[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
    labels: dict[str, Any] = meta["labels"] if isinstance(meta.get("labels"), dict) else {}
    ns, svc = meta.get("namespace", "default"), labels.get(hints.LABEL_SERVICE_NAME, "")
    # a list here (service-name: [web]) made the set below raise TypeError: unhashable
    return (ns if isinstance(ns, str) else "", svc if isinstance(svc, str) else "")


def diagnose(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
             endpointslices: list[dict[str, Any]], *, source: str, service: str | None = None,
             node: str | None = None, version: str = hints.DEFAULT_VERSION,
             feature_gates: dict[str, bool] | None = None,
             hints_populated: list[str] | None = None) -> list[hints.ServiceDiagnosis]:
    """Validate the explain inputs and run the model.

    Raises:
        InputError: malformed objects, unknown ``--service``/``--node``, a Service with a
            selector but no EndpointSlice, bad version or gates.
    """
    if service is not None:
        ns, name = _split_service(service)
        services = [s for s in services if isinstance(s.get("metadata"), dict)
                    and s["metadata"].get("name") == name
                    and s["metadata"].get("namespace", "default") == ns]
        if not services:
            raise InputError("no such Service in the input", source=source, field="--service")
    if node is not None and not any(isinstance(n.get("metadata"), dict)
                                    and n["metadata"].get("name") == node for n in nodes):
        raise InputError(f"no Node {node!r} in the input", source=source, field="--node")
    labelled = {_slice_service(s) for s in endpointslices if isinstance(s, dict)}
    for s in services:
        meta: dict[str, Any] = s["metadata"] if isinstance(s.get("metadata"), dict) else {}
        key = (meta.get("namespace", "default"), meta.get("name"))
        if _has_selector(s) and key not in labelled:
            raise InputError(
                "has a selector but no EndpointSlice labelled "
                f"{hints.LABEL_SERVICE_NAME}={key[1]} (dump endpointslices too: kubectl get "
                "nodes,services,endpointslices,pods -A -o json)",
                source=source, obj=f"Service {key[0]}/{key[1]}", field="metadata.name")
    try:
        return hints.evaluate_cluster(nodes, services, endpointslices, version=version,
                                      feature_gates=feature_gates, hints_populated=hints_populated,
                                      strict=True)
    except InputError as err:
        raise err.with_source(source) from None


def to_document(diags: list[hints.ServiceDiagnosis], version: str, node: str | None = None) -> dict[str, Any]:
    """The explain JSON document: ``{"kubernetes_version", "services": [...]}``."""
    import gc

    only = [node] if node is not None else None
    was = gc.isenabled()
    gc.disable()  # plain acyclic dicts; avoid full scans while building many of them
    try:
        return {"kubernetes_version": version, "services": [d.to_json(only) for d in diags]}
    finally:
        if was:
            gc.enable()


def explain(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
            endpointslices: list[dict[str, Any]], *, source: str, service: str | None = None,
            node: str | None = None, version: str = hints.DEFAULT_VERSION,
            feature_gates: dict[str, bool] | None = None,
            hints_populated: list[str] | None = None) -> dict[str, Any]:
    """Build the explain JSON document (schema in docs/hints.md).

    Raises:
        InputError: see :func:`diagnose`.
    """
    diags = diagnose(nodes, services, endpointslices, source=source, service=service, node=node,
                     version=version, feature_gates=feature_gates, hints_populated=hints_populated)
    return to_document(diags, str(hints.KubeVersion.parse(version, feature_gates)), node)


def _load(args: argparse.Namespace) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    if args.snapshot:
        from agent.k8s import snapshot

        snap = snapshot.load(args.snapshot)
        if not (snap.nodes or snap.services or snap.endpointslices):
            raise InputError("no Node, Service or EndpointSlice in it (empty snapshot?); make one "
                             "with: kubectl get nodes,services,endpointslices,pods -A -o json "
                             "> dump.json", source=args.snapshot)
        return args.snapshot, {"nodes": snap.nodes, "services": snap.services,
                               "endpointslices": snap.endpointslices, "pods": snap.pods}
    from agent.k8s.client import build_api_client, list_cluster

    api = build_api_client(args.kubeconfig, context=args.context)
    return (args.kubeconfig or "in-cluster"), list_cluster(api)


#: above this many Service entries the JSON is printed compact (the indenting encoder is slow)
_INDENT_MAX = 200


def run_explain(args: argparse.Namespace) -> int:
    """``zonemeter explain``: print the table or JSON; 0 on success."""
    gates = parse_feature_gates(args.feature_gates)
    hints.KubeVersion.parse(args.kubernetes_version, gates)  # flag errors before any I/O
    populated = None
    if args.hints_populated is not None:
        populated = [p.strip() for p in args.hints_populated.split(",") if p.strip()]
        for entry in populated:  # a typo here silently changed the diagnosis before
            ns, sep, name = entry.partition("/")
            if not (sep and ns and name) or "/" in name:
                raise InputError(f"expected NAMESPACE/NAME[,...], got {entry!r}",
                                 source="--hints-populated")
    if args.context is not None and args.kubeconfig is None:
        raise InputError("only with --kubeconfig", source="--context")
    # Acyclic data freed by refcounting: the cyclic collector's repeated full scans of a large
    # cluster (while parsing the dump and building the model) cost more than the model itself,
    # so it is paused for the run (and restored, as tests call this in-process).
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        source, objs = _load(args)
        diags = diagnose(objs["nodes"], objs["services"], objs["endpointslices"], source=source,
                         service=args.service, node=args.node, version=args.kubernetes_version,
                         feature_gates=gates, hints_populated=populated)
        version = str(hints.KubeVersion.parse(args.kubernetes_version, gates))
        if args.output == "json":
            doc = to_document(diags, version, args.node)
            # indented for people; compact (C encoder, one write) when it is large
            sys.stdout.write(json.dumps(doc, indent=2 if len(diags) <= _INDENT_MAX else None) + "\n")
        else:
            sys.stdout.write(render_table(diags, version, args.node))
    finally:
        if was_enabled:
            gc.enable()
    return 0


def render_table(diags: list[hints.ServiceDiagnosis], version: str, node: str | None = None) -> str:
    """Human-readable explain output: one line per Service, then its warnings and events."""
    rows = [("SERVICE", "FAMILY", "MECHANISM", "REASON", "LOCAL ZONES")]
    details: list[list[str]] = []
    for d in diags:
        loc = d.locality_in_effect
        on = sorted(z for z, v in loc.items() if v)
        local = f"{len(on)}/{len(loc)}" + (f" ({','.join(on)})" if on and len(on) < len(loc) else "")
        rows.append((f"{d.namespace}/{d.name}", d.address_type, d.mechanism, d.reason, local))
        lines = [f"  ! {w.code}: {w.message}" for w in d.warnings]
        for e in d.controller.events:
            lines.append(f"  event {e.type} {e.reason}: {e.message}")
        if node is not None and node in d.proxy:
            p = d.proxy[node]
            eps = p.local_endpoints if p.internal_traffic == "local" else p.cluster_endpoints
            shown = "" if p.internal_traffic in ("DROP", "REJECT") else f" -> {', '.join(eps or ())}"
            lines.append(f"  node {node}: topology_mode={p.topology_mode!r} "
                         f"internal={p.internal_traffic}{shown}")
        details.append(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [f"Kubernetes {version}: {len(diags)} Service "
           f"{'entry' if len(diags) == 1 else 'entries'}"]
    if not diags:
        out.append("no Services in the input: nothing to explain (Nodes and EndpointSlices "
                   "alone have no topology-aware routing)")
        return "\n".join(out) + "\n"
    out.append("  ".join(c.ljust(w) for c, w in zip(rows[0], widths)).rstrip())
    for row, lines in zip(rows[1:], details):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        out.extend(lines)
    out.append("reason 'none' = kube-proxy filters by topology in every client zone; "
               "see docs/hints.md for the vocabulary")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# what-if
# ---------------------------------------------------------------------------------------------


def _parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            k, sep, v = part.partition("=")
            if not sep or not k.strip() or not v.strip():
                raise InputError(f"expected ZONE=VALUE, got {part!r}", field=flag)
            if k.strip() in out:
                raise InputError(f"zone {k.strip()!r} given twice", field=flag)
            out[k.strip()] = v.strip()
    return out


def what_if(zones: dict[str, str], replicas: range, spread: dict[str, int] | None = None,
            version: str = hints.DEFAULT_VERSION) -> dict[str, Any]:
    """Run the controller model for each replica count on a synthetic cluster.

    One Ready worker per zone with the given allocatable CPU; ``n`` ready endpoints placed by
    cycling through the zones (``spread`` endpoints per zone per round, default 1), in zone
    order; one Service with ``topology-mode: Auto``.

    Returns:
        ``{"rows": [{"replicas", "hints_enabled", "reason", "minimums", "hints_per_zone"}]}``.

    Raises:
        InputError: bad CPU quantity (``--zone``) or spread zone (``--spread``).
    """
    nodes = []
    for z, cpu in zones.items():
        try:
            hints.cpu_millis(cpu, f"zone {z}")
        except InputError as err:
            raise InputError(err.problem, obj=f"zone {z}", field="--zone") from None
        nodes.append({"kind": "Node", "metadata": {"name": f"what-if-{z}", "labels": {hints.LABEL_ZONE: z}},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                 "allocatable": {"cpu": cpu}}})
    spread = spread or {z: 1 for z in zones}
    for z in spread:
        if z not in zones:
            raise InputError(f"zone {z!r} is not among --zone", field="--spread")
    cycle = [z for z in zones if z in spread for _ in range(spread[z])]
    if not cycle:
        raise InputError("places no endpoint", field="--spread")
    svc = {"kind": "Service", "metadata": {"name": "what-if", "namespace": "default",
                                           "annotations": {hints.ANNOTATION_TOPOLOGY_MODE: "Auto"}},
           "spec": {"ports": [{"port": 80}]}}
    rows = []
    for n in replicas:
        eps = [{"addresses": [f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"],
                "conditions": {"ready": True}, "zone": cycle[i % len(cycle)],
                "nodeName": f"what-if-{cycle[i % len(cycle)]}"} for i in range(n)]
        es = {"kind": "EndpointSlice", "addressType": "IPv4",
              "metadata": {"name": "what-if-1", "namespace": "default",
                           "labels": {hints.LABEL_SERVICE_NAME: "what-if",
                                      hints.LABEL_MANAGED_BY: hints.CONTROLLER_NAME}},
              "ports": [{"name": "", "port": 80}], "endpoints": eps}
        d = hints.evaluate_cluster(nodes, [svc], [es], version=version, hints_populated=(), strict=True)[0]
        c = d.controller
        per_zone: dict[str, int] | None = None
        if c.hints_enabled:
            per_zone = {z: 0 for z in zones}
            for h in c.hints.values():
                for z in (h.for_zones if h else ()):
                    per_zone[z] = per_zone.get(z, 0) + 1
        rows.append({"replicas": n, "hints_enabled": c.hints_enabled,
                     "reason": c.refusal_reason,
                     "minimums": dict(c.minimums) if c.minimums is not None else None,
                     "hints_per_zone": per_zone})
    return {"rows": rows}


#: largest replica count (or --spread count) what-if models: beyond any real Service
MAX_WHATIF_REPLICAS = 100_000
#: most endpoints what-if builds over a whole range (about 1 s per million)
MAX_WHATIF_ENDPOINTS = 5_000_000


def _parse_range(text: str) -> range:
    m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", text)
    if not m:
        raise InputError(f"expected A-B or N, got {text!r}", field="--replicas")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    if a < 1 or b < a or b - a > 10000 or b > MAX_WHATIF_REPLICAS:
        raise InputError(f"bad range {text!r} (1 <= A <= B <= {MAX_WHATIF_REPLICAS}, at most "
                         "10000 counts)", field="--replicas")
    if (a + b) * (b - a + 1) // 2 > MAX_WHATIF_ENDPOINTS:
        raise InputError(f"range {text!r} models more than {MAX_WHATIF_ENDPOINTS} endpoints in "
                         "all; narrow it", field="--replicas")
    return range(a, b + 1)


def run_what_if(args: argparse.Namespace) -> int:
    """``zonemeter what-if``: print the table or JSON; 0 on success."""
    zones = _parse_pairs(args.zone, "--zone")
    if len(zones) < 2:
        raise InputError("give at least two zones (Auto needs 2 or more)", field="--zone")
    spread = None
    if args.spread:
        raw = _parse_pairs([args.spread], "--spread")
        spread = {}
        for z, v in raw.items():
            if not re.fullmatch(r"[0-9]+", v) or int(v) > MAX_WHATIF_REPLICAS:
                raise InputError(f"count for {z!r} must be an integer 0..{MAX_WHATIF_REPLICAS}",
                                 field="--spread")
            spread[z] = int(v)
    doc = what_if(zones, _parse_range(args.replicas), spread)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    zs = list(zones)
    out = ["REPLICAS  HINTS  " + "  ".join(f"MIN {z}" for z in zs) + "  HINTS PER ZONE / REASON"]
    for r in doc["rows"]:
        mins = "  ".join(str((r["minimums"] or {}).get(z, "-")).rjust(len(f"MIN {z}")) for z in zs)
        tail = ("/".join(str(r["hints_per_zone"][z]) for z in zs) if r["hints_enabled"]
                else f"refused: {r['reason']}")
        out.append(f"{r['replicas']:>8}  {'yes' if r['hints_enabled'] else 'no':<5}  {mins}  {tail}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
