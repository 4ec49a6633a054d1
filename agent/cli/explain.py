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
    KubeVersion,
    ServiceDiagnosis,
    choose_version,
    diagnose_objects,
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
"""


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
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=run_explain)


def _load(args: argparse.Namespace) -> tuple[str, dict[str, list[dict[str, Any]]], tuple[str | None, str]]:
    """Read the input: ``(source name, objects, (reported gitVersion or None, its source))``."""
    if args.snapshot:
        from agent.k8s import snapshot

        snap = snapshot.load(args.snapshot)
        if not (snap.nodes or snap.services or snap.endpointslices):
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
    """``zonemeter explain``: print the table or JSON; 0 on success."""
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
        source, objs, (reported, kind) = _load(args)
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
                                 kube_proxy_version=proxy_version)
        version = str(KubeVersion.parse(version, gates))
        if args.output == "json":
            doc = to_document(diags, version, args.node, versions)
            # indented for people; compact (C encoder, one write) when it is large
            sys.stdout.write(json.dumps(doc, indent=2 if len(diags) <= _INDENT_MAX else None) + "\n")
        else:
            sys.stdout.write(render_table(diags, version, args.node, versions))
    finally:
        if was_enabled:
            gc.enable()
    return 0


def render_table(diags: list[ServiceDiagnosis], version: str, node: str | None = None,
                 versions: dict[str, Any] | None = None) -> str:
    """Human-readable explain output: one line per Service, then its warnings and events.

    ``versions`` (:func:`agent.hints.version_document`) adds a line naming the nodes whose
    kube-proxy version differs from the control plane's.
    """
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
    if not diags:
        out.append("no Services in the input: nothing to explain (Nodes and EndpointSlices "
                   "alone have no topology-aware routing)")
        return "\n".join(out) + "\n"
    out.append("  ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=False)).rstrip())
    for row, lines in zip(rows[1:], details, strict=False):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
        out.extend(lines)
    out.append("reason 'none' = kube-proxy filters by topology in every client zone; "
               "see docs/hints.md for the vocabulary")
    return "\n".join(out) + "\n"
