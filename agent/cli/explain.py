"""``zonemeter explain``: arguments, input loading (snapshot file or live cluster) and printing.

The diagnosis itself is :mod:`agent.hints.explain`.

Examples:
    zonemeter explain --snapshot dump.json
    zonemeter explain --snapshot dump.yaml --service shop/cart --node worker-3 -o json
    zonemeter explain --kubeconfig ~/.kube/config --kubernetes-version 1.31

The control-plane version comes from ``--kubernetes-version``, else the cluster
(``/version``, or the ``version.json`` beside ``--snapshot``), else the newest covered; each
node's kube-proxy version from ``--kube-proxy-version``, else the Node's ``status.nodeInfo``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agent.errors import InputError
from agent.hints import (
    DEFAULT_VERSION,
    ExplainProblem,
    KubeVersion,
    ServiceDiagnosis,
    choose_version,
    diagnose_objects,
    hinted_per_zone,
    load_problem,
    parse_feature_gates,
    parse_proxy_flag,
    to_document,
    version_document,
)

_EPILOG_EXPLAIN = """examples:
  zonemeter explain --snapshot dump.json
  zonemeter explain --snapshot dump.yaml --service shop/cart --node worker-3 -o json
  zonemeter explain --kubeconfig ~/.kube/config --kubernetes-version 1.31 \\
      --feature-gates PreferSameTrafficDistribution=true
dump with: kubectl get nodes,services,endpointslices,pods -A -o json > dump.json
           kubectl version -o json > version.json   # beside the dump: the cluster's version
exit codes: 0 every Service explained; 3 some object could not be used (a Service without
  EndpointSlices, a malformed object): it is a row of its own, every other Service is
  explained; 2 bad input (unreadable file, bad flag, no usable Service); 1 runtime failure
"""

#: exit code when some objects were reported as rows of their own (``ExplainProblem``)
EXIT_PROBLEMS = 3


def register(subparsers: Any) -> None:
    """Add the ``explain`` verb."""
    p = subparsers.add_parser(
        "explain", help="explain topology-aware routing per Service",
        description="Explain, per Service, whether topology-aware routing keeps ClusterIP traffic "
        "in its zone, reproducing the EndpointSlice controller and kube-proxy (1.27-1.37).",
        epilog=_EPILOG_EXPLAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--snapshot", metavar="FILE", help="kubectl JSON/YAML dump to read")
    src.add_argument("--kubeconfig", metavar="FILE",
                     help="list a live cluster with this kubeconfig (default, as kubectl: $KUBECONFIG, "
                     "then ~/.kube/config, then in-cluster config)")
    p.add_argument("--context", help="kubeconfig context (default: the kubeconfig's current context)")
    p.add_argument("--service", metavar="NS/NAME", help="only this Service")
    p.add_argument("--node", metavar="NODE", help="only this node in the proxy view")
    p.add_argument("--kubernetes-version", default=None, metavar="X.Y",
                   help="control-plane version to model, 1.27 to 1.37 (default: from the "
                   "cluster's /version, or the version.json beside --snapshot; else "
                   f"{DEFAULT_VERSION})")
    p.add_argument("--kube-proxy-version", default="auto", metavar="auto|X.Y",
                   help="kube-proxy version of the nodes: auto = each Node's status.nodeInfo "
                   "(kubeProxyVersion, else kubeletVersion), X.Y = every node (default %(default)s)")
    p.add_argument("--feature-gates", default="", metavar="NAME=BOOL,...",
                   help="feature gate overrides of the control-plane version, e.g. "
                   "PreferSameTrafficDistribution=false (kube-proxies of another version run "
                   "that version's defaults)")
    p.add_argument("--hints-populated", metavar="NS/NAME,...", default=None,
                   help="Services the controller's topology cache already marks as having Auto "
                   "hints (controls Enabled/Disabled events; default: inferred from the slices)")
    p.add_argument("--prometheus", metavar="URL", default=None,
                   help="a Prometheus scraping the agents: add, per Service, why its hint-ignored "
                   "bytes of the last --window ignored the hints, by client node and cause "
                   "(docs/attribution.md, Why bytes ignored the hints)")
    p.add_argument("--window", metavar="DURATION", default="1h",
                   help="with --prometheus: how far back to look (default %(default)s)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=run_explain)


def traffic_verdicts(client: Any, seconds: float, at: float,
                     proxy_versions: dict[str, str] | None = None) -> list[Any]:
    """Why the hint-ignored bytes of the ``seconds`` before ``at`` ignored the hints: two
    instant queries (``increase()`` of ``zonemeter_service_hint_ignored_bytes_total`` by
    client node and kind, of ``zonemeter_service_client_path_bytes_total`` by client node
    and path) turned into :class:`agent.attribution.verdict.HintVerdict` rows.

    Args:
        client: an :class:`agent.report.prom.PromClient` (or anything with its ``query``).
        seconds: the window, seconds.
        at: its end, Unix seconds.
        proxy_versions: node -> kube-proxy version its Node reports, named in verdicts.

    Raises:
        InputError: from the client (unreachable Prometheus, refused query).
    """
    from agent.attribution.verdict import hint_verdicts

    w = f"{int(round(seconds * 1000))}ms"

    def series(promql: str, last: str) -> dict[tuple[str, str, str, str], int]:
        out: dict[tuple[str, str, str, str], int] = {}
        for smp in client.query(promql, at):
            lb = smp.labels
            if smp.value == smp.value and smp.value > 0:  # not NaN
                k = (lb.get("namespace", ""), lb.get("service", ""), lb.get("client_node", "unknown"),
                     lb.get(last, ""))
                out[k] = out.get(k, 0) + int(round(smp.value))
        return out

    ignored = series("sum by (namespace, service, client_node, client_kind) "
                     f"(increase(zonemeter_service_hint_ignored_bytes_total[{w}]))", "client_kind")
    paths = series("sum by (namespace, service, client_node, path) "
                   f"(increase(zonemeter_service_client_path_bytes_total[{w}]))", "path")
    return hint_verdicts(ignored, paths, proxy_versions)


def _load(args: argparse.Namespace, problems: list[ExplainProblem] | None = None
          ) -> tuple[str, dict[str, list[dict[str, Any]]], tuple[str | None, str]]:
    """Read the input: ``(source name, objects, (reported gitVersion or None, its source))``;
    objects the snapshot loader skips are appended to ``problems``."""
    if args.snapshot:
        from agent.k8s import snapshot

        skipped: list[InputError] = []
        snap = snapshot.load(args.snapshot, skipped)
        if problems is not None:
            problems.extend(load_problem(err) for err in skipped)
        if not (snap.nodes or snap.services or snap.endpointslices):
            if skipped:
                raise skipped[0]
            raise InputError("no Node, Service or EndpointSlice in it (empty snapshot?); make one "
                             "with: kubectl get nodes,services,endpointslices,pods -A -o json "
                             "> dump.json", source=args.snapshot)
        from agent.k8s.version import snapshot_version

        reported = snapshot_version(args.snapshot) if args.kubernetes_version is None else None
        return args.snapshot, {"nodes": snap.nodes, "services": snap.services,
                               "endpointslices": snap.endpointslices, "pods": snap.pods}, \
            (reported, "snapshot")
    from agent.errors import RuntimeFailure
    from agent.k8s.client import build_api_client, kubeconfig_source, list_cluster
    from agent.k8s.version import server_version

    api = build_api_client(args.kubeconfig, context=args.context)
    objs = list_cluster(api)
    reported = None
    if args.kubernetes_version is None:
        try:
            reported = server_version(api)
        except RuntimeFailure as err:
            _warn(f"{err}; modelling Kubernetes {DEFAULT_VERSION} (give --kubernetes-version to choose)")
    found = kubeconfig_source(args.kubeconfig)
    return (found[1] if found else "in-cluster"), objs, (reported, "cluster")


def _warn(sentence: str) -> None:
    """One warning line on stderr."""
    sys.stderr.write(f"zonemeter explain: warning: {sentence}\n")


#: above this many Service entries the JSON is printed compact (the indenting encoder is slow)
_INDENT_MAX = 200


def run_explain(args: argparse.Namespace) -> int:
    """``zonemeter explain``: print the table or JSON; 0 when every Service was explained,
    :data:`EXIT_PROBLEMS` when some object was reported as a row of its own."""
    gates = parse_feature_gates(args.feature_gates)
    proxy_version = parse_proxy_flag(args.kube_proxy_version)
    if args.kubernetes_version is not None:
        KubeVersion.parse(args.kubernetes_version, gates)  # flag errors before any I/O
    populated = None
    if args.hints_populated is not None:
        populated = [p.strip() for p in args.hints_populated.split(",") if p.strip()]
        for entry in populated:  # a typo here silently changed the diagnosis before
            ns, sep, name = entry.partition("/")
            if not (sep and ns and name) or "/" in name:
                raise InputError(f"expected NAMESPACE/NAME[,...], got {entry!r}",
                                 source="--hints-populated")
    from agent.k8s.client import kubeconfig_source

    if args.context is not None and (args.snapshot or kubeconfig_source(args.kubeconfig) is None):
        raise InputError("needs a kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config), not "
                         + ("--snapshot" if args.snapshot else "in-cluster configuration"), source="--context")
    # Acyclic data freed by refcounting: the cyclic collector's repeated full scans of a large
    # cluster (while parsing the dump and building the model) cost more than the model itself,
    # so it is paused for the run (and restored, as tests call this in-process).
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        problems: list[ExplainProblem] = []
        source, objs, (reported, kind) = _load(args, problems)
        what = "the snapshot's version.json" if kind == "snapshot" else "the API server"
        version, version_source, note = choose_version(args.kubernetes_version, reported, kind, what)
        try:
            KubeVersion.parse(version, gates)
        except InputError as err:  # gates valid for the flag's default, not for the cluster's
            raise InputError(f"{err.problem} (the cluster's version)", source="--feature-gates") from None
        versions = version_document(objs["nodes"], version, feature_gates=gates,
                                    kube_proxy_version=proxy_version, source=version_source,
                                    warnings=[note] if note else [])
        for sentence in versions["version_warnings"]:
            _warn(sentence)
        diags = diagnose_objects(objs["nodes"], objs["services"], objs["endpointslices"], source=source,
                                 service=args.service, node=args.node, version=version,
                                 feature_gates=gates, hints_populated=populated,
                                 kube_proxy_version=proxy_version, problems=problems)
        version = str(KubeVersion.parse(version, gates))
        verdicts = None
        seconds = 0.0
        if args.prometheus is not None:
            import time

            from agent.report.prom import PromClient
            from agent.report.timespec import parse_duration

            seconds = parse_duration(args.window)
            verdicts = traffic_verdicts(PromClient(args.prometheus), seconds, time.time(),
                                        dict(versions.get("kube_proxy_versions", {})))
        if args.output == "json":
            doc = to_document(diags, version, args.node, versions, problems)
            if verdicts is not None:
                doc["hint_ignored_causes"] = _verdicts_json(verdicts, seconds)
            # indented for people; compact (C encoder, one write) when it is large
            sys.stdout.write(json.dumps(doc, indent=2 if len(diags) <= _INDENT_MAX else None) + "\n")
        else:
            text = render_table(diags, version, args.node, versions,
                                detail=args.service is not None, problems=problems)
            if verdicts is not None:
                text += render_verdicts(verdicts, seconds, args.window, args.service)
            sys.stdout.write(text)
    finally:
        if was_enabled:
            gc.enable()
    return EXIT_PROBLEMS if problems else 0


def _verdicts_json(verdicts: list[Any], seconds: float) -> list[dict[str, Any]]:
    """The ``hint_ignored_causes`` key of the explain JSON with ``--prometheus``."""
    from agent.attribution.verdict import verdict_sentence

    return [{"namespace": v.namespace, "service": v.service, "client_node": v.client_node,
             "cause": v.cause, "bytes": v.bytes, "bytes_per_second": v.bytes / seconds,
             "kube_proxy_version": v.kube_proxy_version,
             "sentence": verdict_sentence(v, seconds)} for v in verdicts]


def render_verdicts(verdicts: list[Any], seconds: float, window: str,
                    service: str | None = None) -> str:
    """The table's lines for ``--prometheus``: per Service (only ``service`` when given) with
    hint-ignored bytes in the window, one line per client node and cause."""
    from agent.attribution.verdict import verdict_sentence

    rows = [v for v in verdicts if service is None or f"{v.namespace}/{v.service}" == service]
    out = [f"why bytes ignored the hints (last {window}, from Prometheus):"]
    if not rows:
        out.append("  no hint-ignored bytes")
    for v in rows:
        out.append(f"  {v.namespace}/{v.service}: {v.cause}: {verdict_sentence(v, seconds)}")
    return "\n".join(out) + "\n"


def _pct(share: float | None) -> str:
    """A share as a whole percentage; ``<1%`` for a small non-zero share, ``-`` for None."""
    if share is None:
        return "-"
    pct = round(share * 100)
    return "<1%" if pct == 0 and share > 0 else f"{pct}%"


def local_zones(d: ServiceDiagnosis) -> str:
    """The LOCAL ZONES cell: ``on/all``, the zones in effect when not all, and ``node-local``
    when every zone keeps ClusterIP traffic on the client's node."""
    loc = d.locality_in_effect
    on = sorted(z for z, v in loc.items() if v)
    text = f"{len(on)}/{len(loc)}" + (f" ({','.join(on)})" if on and len(on) < len(loc) else "")
    scopes = set(d.locality_scope.values())
    if loc and scopes == {"node"}:
        text += " node-local"
    return text


def expected_cell(d: ServiceDiagnosis) -> str:
    """The EXPECTED CROSS-ZONE cell: the largest expected share and the zones that have it
    (``0%`` when no zone's calls cross, ``-`` when no zone delivers a call)."""
    known = {z: v for z, v in d.expected_cross_zone.items() if v is not None}
    if not known:
        return "-"
    top = max(known.values())
    if top == 0:
        return "0%"
    zones = sorted(z for z, v in known.items() if v == top)
    return ("" if len(known) == 1 else "max ") + f"{_pct(top)} ({','.join(zones)})"


def render_detail(d: ServiceDiagnosis) -> list[str]:
    """The full diagnosis of one Service entry (``explain --service``), as indented lines:
    mechanism, reason and its sentence, locality per zone, the controller's arithmetic,
    what kube-proxy selects per client zone with the expected cross-zone share, the
    warnings and the events the controller would emit."""
    c = d.controller
    out = [f"  mechanism: {d.mechanism} (requested: {d.mode})",
           f"  reason: {d.reason}: {d.reason_sentence}"]
    if d.locality_in_effect:
        out.append("  locality: " + ", ".join(
            f"{z} {d.locality_scope.get(z, 'off')}" for z in sorted(d.locality_in_effect))
            + "  (node = kept on the client's node, zone = in its zone, off = every zone)")
    out.append(f"  controller: {c.ready_endpoint_count} ready endpoint(s); "
               + ("hints written" if c.hints_enabled else "no hints written")
               + (f"; Auto refused: {c.refusal_reason}" if c.refusal_reason else ""))
    ratios = c.zone_cpu_ratios
    if ratios is not None or c.minimums is not None:
        per_zone = hinted_per_zone(c.hints) if c.hints_enabled else {}
        zones = sorted(set(ratios or {}) | set(c.minimums or {}))
        rows = [("zone", "CPU share", "minimum", "maximum", "desired", "hinted")]
        for z in zones:
            a = c.allocations.get(z) if c.allocations else None
            rows.append((z, f"{ratios[z]:.3f}" if ratios and z in ratios else "-",
                         str(c.minimums[z]) if c.minimums and z in c.minimums else "-",
                         str(a.maximum) if a else "-", f"{a.desired:.2f}" if a else "-",
                         str(per_zone.get(z, 0)) if c.hints_enabled else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            out.append("    " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip())
        if c.sum_of_minimums is not None:
            out.append(f"    sum of minimums {c.sum_of_minimums} of {c.ready_endpoint_count} ready "
                       "endpoint(s) (minimum = ceil(CPU share x N / 1.2))")
    for addr, own, to in d.donations:
        out.append(f"    donated: {addr} (zone {own}) is hinted for zone {to}")
    if d.client_groups:
        out.append("  clients per zone (expected cross-zone share: equal weight per selected "
                   "endpoint and per node):")
    for z in sorted(d.expected_cross_zone):
        share = d.expected_cross_zone[z]
        out.append(f"    zone {z}: " + (f"expected cross-zone {_pct(share)}" if share is not None else
                                       "no expected share (no call delivered, or no zone label)"))
        for g in (g for g in d.client_groups if g.zone == z):
            names = ", ".join(g.sample) + (" ..." if g.nodes > len(g.sample) else "")
            ver = f", kube-proxy {g.kube_proxy}" if g.kube_proxy else ""
            how = g.internal_traffic + (f" ({g.topology_mode})" if g.topology_mode else "")
            eps = ", ".join(f"{k} (zone {d.endpoint_zones.get(k) or '?'})" for k in g.endpoints[:8]) + (
                f" and {len(g.endpoints) - 8} more" if len(g.endpoints) > 8 else "")
            if g.endpoints:
                what = f"{how} -> {eps}; cross-zone {_pct(g.cross_zone_share)}"
            else:
                what = f"{how}: no call delivered"
            out.append(f"      {g.nodes} node(s) ({names}{ver}): {what}")
    out.append("  warnings:" + ("" if d.warnings else " none"))
    out.extend(f"    ! {w.code}: {w.message}" for w in d.warnings)
    out.append("  events the controller would emit:" + ("" if c.events else " none"))
    out.extend(f"    {e.type} {e.reason}: {e.message}" for e in c.events)
    return out


def render_table(diags: list[ServiceDiagnosis], version: str, node: str | None = None,
                 versions: dict[str, Any] | None = None, detail: bool = False,
                 problems: list[ExplainProblem] | None = None) -> str:
    """Human-readable explain output: one line per Service, then its warnings and events.

    ``versions`` (:func:`agent.hints.version_document`) adds a line naming the nodes whose
    kube-proxy version differs from the control plane's. ``detail`` (``--service``) prints
    each entry's full diagnosis (:func:`render_detail`) instead of its warning and event
    lines. Each of ``problems`` is a row of its own after the Services (the Service, or the
    object when it belongs to none; REASON ``no-endpointslices`` or ``malformed-object``)
    followed by its one-line error.
    """
    rows = [("SERVICE", "FAMILY", "MECHANISM", "REASON", "LOCAL ZONES", "EXPECTED CROSS-ZONE")]
    details: list[list[str]] = []
    for d in diags:
        rows.append((f"{d.namespace}/{d.name}", d.address_type, d.mechanism, d.reason, local_zones(d),
                     expected_cell(d)))
        if detail:
            lines = render_detail(d)
        else:
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
    for prob in problems or ():
        rows.append((prob.service or prob.object, "-", "-", prob.reason, "-", "-"))
        details.append([f"  ! {prob.message}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [f"Kubernetes {version}: {len(diags)} Service "
           f"{'entry' if len(diags) == 1 else 'entries'}"]
    if versions is not None:
        others: dict[str, list[str]] = {}
        for n, v in versions.get("kube_proxy_versions", {}).items():
            others.setdefault(v, []).append(n)
        base = versions.get("kube_proxy_version", version)
        parts = ([] if base == version else [f"{base} on every {'other ' if others else ''}node"]) + [
            f"{v} on {len(ns)} node(s) ({', '.join(ns[:5])}{' ...' if len(ns) > 5 else ''})"
            for v, ns in sorted(others.items())]
        if parts:
            out.append("kube-proxy " + "; ".join(parts))
    if not diags and not problems:
        out.append("no Services in the input: nothing to explain (Nodes and EndpointSlices "
                   "alone have no topology-aware routing)")
        return "\n".join(out) + "\n"
    out.append("  ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=False)).rstrip())
    for row, lines in zip(rows[1:], details, strict=False):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
        out.extend(lines)
    if problems:
        out.append(f"{len(problems)} object(s) could not be used (rows with FAMILY -); every other "
                   "Service is explained")
    out.append("reason 'none' = kube-proxy filters by topology in every client zone; EXPECTED "
               "CROSS-ZONE = largest share of a zone's calls expected to cross zones; see "
               "docs/hints.md for the vocabulary")
    return "\n".join(out) + "\n"
