"""The demo's summary: the agents' numbers beside the lab's ground truth, per Service.

JSON (``zonemeter demo -o json``), exactly the schema of docs/demo.md::

    {"duration_seconds": float,
     "services": [{"namespace", "name", "bytes": {crossing: int}, "cross_zone_bytes": int,
                   "ground_truth_cross_zone_bytes": int, "hint_ignored_bytes": int,
                   "ground_truth_hint_ignored_bytes": int, "locality_in_effect": {zone: bool},
                   "reason": str, "warnings": [str], "usd_per_month_at_aws_price": float,
                   "expected_cross_zone": {zone: float}, "observed_cross_zone": {zone: float},
                   "hint_ignored_causes": [{"client_node", "cause", "bytes",
                                            "ground_truth_bytes", "ground_truth_cause",
                                            "kube_proxy_version", "sentence"}],
                   "cost_by_class": [{"hop", "client_kind", "lb_type", "cross_zone_bytes", "billed",
                                      "usd_per_month_at_aws_price", "reason"}],
                   "entry_by_client_kind": [{"client_kind", "client_zone", "server_zone",
                                             "crossing", "direction", "bytes",
                                             "ground_truth_bytes"}]}],
     "workloads": [{"namespace", "workload", "workload_kind", "remote_kind", "client_zone",
                    "remote_zone", "bytes": {crossing: int}, "cross_zone_bytes": int,
                    "usd_per_month_at_aws_price": float, "billed": bool, "reason": str}],
     "usd_per_month_at_aws_price": {"services": float, "workloads": float, "total": float},
     "double_counted_bytes": int}

(``usd_per_month_at_aws_price`` is an extra key beyond the founders' schema (docs/demo.md): the measured
window's cross-zone bytes/s, warm-up left out, held for a 30.44-day month at AWS's $0.02 per GB
crossing; an extrapolation of the lab's traffic rate. ``expected_cross_zone`` (the agents'
``zonemeter_service_expected_cross_zone_ratio``) and ``observed_cross_zone`` (per client
zone, the measured window's cross-zone bytes over all its bytes of the Service, both
directions; zones that sent nothing are absent) are extra keys too: every demo call has the
same size, so a byte share is a call share.)

Dollars follow AWS's rules per client class (``agent.report.pricing``, docs/report.md
*Prices by client class*): a Service's ``usd_per_month_at_aws_price`` prices only the
cross-zone bytes of the classes AWS bills (not an ALB's or a CLB's hop to its targets);
``cost_by_class`` (extra) lists each hop and class with cross-zone bytes, its share of the
dollars ($0 when not billed) and the rule's reason: ``hop`` ``endpoint`` for
``zonemeter_service_bytes_total`` (the hop into the endpoint), ``entry`` for
``zonemeter_service_entry_bytes_total`` (the first hop of a node port, load balancer or
client to the receiving node); a ``workloads`` row is priced by its remote's class
(``billed``, ``reason``). ``entry_by_client_kind`` (extra): the entry hop's bytes per class,
zone pair and direction beside the lab's, which the outside peers count themselves
(:meth:`tools.demo.cluster.DemoCluster.entry_truth`).

``hint_ignored_causes`` (extra): the Service's hint-ignored bytes per client node and cause
(``agent.attribution.verdict``: ``data-plane``, ``client-side``, ``external``, ``unknown``),
the agents' split beside the lab's bytes from that node and the cause the lab played there,
with the sentence the findings print. ``workloads`` (extra): non-Service bytes
(``zonemeter_workload_bytes_total``, both directions) per workload, remote kind and zone pair,
priced as the Services are (the measured window's cross-zone bytes less the warm-up's, at
AWS's price; ``agent.report.pricing``); ``usd_per_month_at_aws_price`` at the top level sums
the Services', the workloads' and both.

``bytes``, ``cross_zone_bytes``, ``hint_ignored_bytes``, ``locality_in_effect`` and
``reason`` are what the agents export (summed over nodes, as Prometheus would);
``ground_truth_*`` come from the lab's nftables counters; ``warnings`` are the hint model's
warning codes (the table's findings and ``zonemeter explain --snapshot FILE`` print
their messages).

``double_counted_bytes``: over every (Service, client zone, server zone, direction), the
bytes the agents report above the lab's count (same-node and same-zone are not told
apart here: for host-network endpoints the agent may only know the zone), plus every byte in
``zonemeter_workload_bytes_total``, both directions, other than a pod's traffic with its own
node (the demo sends only Service traffic, so such a byte is a Service byte counted a second
time; a new pod's interface sends link-scope packets, MLD reports and neighbour discovery, to
its node by itself, which the agents count as the pod's traffic with its node). 0 when every
byte is counted once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agent.attribution.verdict import hint_verdicts, verdict_sentence
from agent.hints import REASON_SENTENCES
from agent.report.pricing import NAMED_PRICES, Price
from tools.demo.agents import AgentMetrics
from tools.demo.cluster import ServiceModel, ServiceTruth, WorkloadKey

#: AWS: $0.01/GB charged on each side of a zone crossing
AWS = Price("aws", NAMED_PRICES["aws"])

_CROSSING_ORDER = ("same_node", "same_zone", "cross_zone", "cross_region", "external", "unknown")


def build_summary(duration_seconds: float, agents: AgentMetrics,
                  truth: Mapping[str, ServiceTruth], models: Mapping[str, ServiceModel],
                  baseline: AgentMetrics | None = None, traffic_seconds: float | None = None,
                  proxy_versions: Mapping[str, str] | None = None,
                  workload_truth: tuple[Mapping[WorkloadKey, int], Mapping[WorkloadKey, int]] | None = None,
                  entry_truth: Mapping[str, Mapping[tuple[str, str, str, str, str], int]] | None = None,
                  ) -> dict[str, Any]:
    """Return the JSON summary (see the module docstring).

    Args:
        duration_seconds: wall time of the traffic (seconds).
        agents: the agents' metrics summed over nodes.
        truth: Service key -> ground truth (from :meth:`DemoCluster.truth`).
        models: Service key -> hint model answer (warnings), in output order.
        baseline: the agents' metrics just before the measured traffic (its cross-zone bytes
            are left out of the cost extrapolation: warm-up); None = count from agent start.
        traffic_seconds: how long the clients sent (seconds), the divisor of the cost
            extrapolation; None = ``duration_seconds``.
        proxy_versions: node -> the kube-proxy version its Node reports, where known (named
            in data-plane verdicts).
        workload_truth: the lab's non-Service bytes as the agents' workload series
            (:meth:`DemoCluster.workload_truth`: seen, unseen); None: the run sent only
            Service traffic, so every workload byte but a pod's link traffic with its own
            node is a Service byte counted twice.
        entry_truth: Service key -> the lab's first hops of node ports
            (:meth:`DemoCluster.entry_truth`); None: compared with nothing (ground truth 0).
    """
    seconds = traffic_seconds if traffic_seconds else duration_seconds
    verdicts = hint_verdicts(agents.hint_ignored_by_node, agents.client_paths, proxy_versions)
    # the sentences' bytes/s: the measured window's bytes (warm-up left out), as the cost's
    window = {(v.namespace, v.service, v.client_node, v.cause): v.bytes for v in hint_verdicts(
        _less(agents.hint_ignored_by_node, baseline.hint_ignored_by_node if baseline else {}),
        _less(agents.client_paths, baseline.client_paths if baseline else {}))}
    services = []
    kinds = bool(agents.service_bytes_by_kind)
    if workload_truth is None:
        double = agents.workload_bytes
        wl_rows: list[dict[str, Any]] = []
    else:
        wl_rows, double = workload_breakdown(agents, *workload_truth)
    for key, model in models.items():
        ns, name = key.split("/", 1)
        t = truth.get(key) or ServiceTruth()
        got: dict[str, int] = {}
        per_key: dict[tuple[str, str, str], int] = {}
        for (sns, sname, cz, sz, crossing, direction), n in agents.service_bytes.items():
            if (sns, sname) == (ns, name):
                got[crossing] = got.get(crossing, 0) + n
                k3 = (cz, sz, direction)
                per_key[k3] = per_key.get(k3, 0) + n
        lab: dict[tuple[str, str, str], int] = {}
        for (cz, sz, _, direction), n in t.by_series.items():
            lab[(cz, sz, direction)] = lab.get((cz, sz, direction), 0) + n
        for k3, n in per_key.items():
            double += max(0, n - lab.get(k3, 0))
        by_pair, by_kind = service_breakdown(agents, t, ns, name, kinds)
        by_entry = entry_breakdown(agents, (entry_truth or {}).get(key, {}), ns, name)
        double += sum(max(0, r["bytes"] - r["ground_truth_bytes"]) for r in by_entry)
        hint = sum(n for (sns, sname, _, _), n in agents.hint_ignored.items()
                   if (sns, sname) == (ns, name))
        _, reason = agents.info.get((ns, name), ("", "unknown"))
        classes = cost_by_class(agents, baseline, ns, name, seconds)
        in_effect = agents.in_effect.get((ns, name), {})
        expected = agents.expected.get((ns, name), {})
        services.append({
            "namespace": ns,
            "name": name,
            "bytes": {c: got[c] for c in _CROSSING_ORDER if c in got},
            "cross_zone_bytes": got.get("cross_zone", 0),
            "ground_truth_cross_zone_bytes": t.cross_zone_bytes,
            "hint_ignored_bytes": hint,
            "ground_truth_hint_ignored_bytes": t.hint_ignored_bytes,
            "locality_in_effect": {z: in_effect[z] for z in sorted(in_effect)},
            "reason": reason,
            "warnings": list(model.warnings),
            "usd_per_month_at_aws_price": round(sum(
                c["usd_per_month_at_aws_price"] for c in classes), 2),
            "expected_cross_zone": {z: expected[z] for z in sorted(expected)},
            "observed_cross_zone": observed_cross_zone(agents, baseline, ns, name),
            "hint_ignored_causes": _causes(ns, name, verdicts, window, t, seconds),
            "cost_by_class": classes,
            "by_zone_pair": by_pair,
            "by_client_kind": by_kind,
            "entry_by_client_kind": by_entry,
        })
    workloads = workload_rows(agents, baseline, seconds)
    usd_services = round(sum(s["usd_per_month_at_aws_price"] for s in services), 2)
    usd_workloads = round(sum(w["usd_per_month_at_aws_price"] for w in workloads), 2)
    return {"duration_seconds": round(duration_seconds, 3), "services": services,
            "workloads": workloads,
            "workload_breakdown": wl_rows,
            "client_kind_exported": kinds,
            "unattributed_bytes": {r: n for r, n in sorted(agents.unattributed.items())},
            "usd_per_month_at_aws_price": {"services": usd_services, "workloads": usd_workloads,
                                           "total": round(usd_services + usd_workloads, 2)},
            "double_counted_bytes": int(double)}


def entry_breakdown(agents: AgentMetrics, truth: Mapping[tuple[str, str, str, str, str], int],
                    ns: str, name: str) -> list[dict[str, Any]]:
    """One Service's first hops of node ports per client class, zone pair and direction,
    agents (``zonemeter_service_entry_bytes_total``) beside the lab's (both since agent
    start).

    Returns:
        rows ``{"client_kind", "client_zone", "server_zone", "crossing", "direction",
        "bytes", "ground_truth_bytes"}`` for every key either side has, sorted.
    """
    got: dict[tuple[str, str, str, str, str], int] = {}
    for (sns, sname, kind, cz, sz, crossing, direction), n in agents.entry_by_kind.items():
        if (sns, sname) == (ns, name):
            k = (kind, cz, sz, crossing, direction)
            got[k] = got.get(k, 0) + n
    return [{"client_kind": k[0], "client_zone": k[1], "server_zone": k[2], "crossing": k[3],
             "direction": k[4], "bytes": got.get(k, 0), "ground_truth_bytes": truth.get(k, 0)}
            for k in sorted(set(got) | set(truth))]


def service_breakdown(agents: AgentMetrics, t: ServiceTruth, ns: str, name: str, kinds: bool
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One Service's bytes per zone pair and direction, and per client class too, agents
    beside the lab (both since agent start, warm-up included).

    Returns:
        ``(by_zone_pair, by_client_kind)``: rows ``{"client_zone", "server_zone", "crossing",
        "direction", "bytes", "ground_truth_bytes"}``, the second with ``client_kind`` first;
        its ``bytes`` are None when the agents export no ``client_kind`` (``kinds`` false).
        Every key either side has, sorted.
    """
    got: dict[tuple[str, str, str, str], int] = {}
    for (sns, sname, cz, sz, crossing, direction), n in agents.service_bytes.items():
        if (sns, sname) == (ns, name):
            k = (cz, sz, crossing, direction)
            got[k] = got.get(k, 0) + n
    pairs = [{"client_zone": k[0], "server_zone": k[1], "crossing": k[2], "direction": k[3],
              "bytes": got.get(k, 0), "ground_truth_bytes": t.by_series.get(k, 0)}
             for k in sorted(set(got) | set(t.by_series))]
    got_kind: dict[tuple[str, str, str, str, str], int] = {}
    for (sns, sname, kind, cz, sz, crossing, direction), n in agents.service_bytes_by_kind.items():
        if (sns, sname) == (ns, name):
            k5 = (kind, cz, sz, crossing, direction)
            got_kind[k5] = got_kind.get(k5, 0) + n
    by_kind = [{"client_kind": k[0], "client_zone": k[1], "server_zone": k[2], "crossing": k[3],
                "direction": k[4], "bytes": got_kind.get(k, 0) if kinds else None,
                "ground_truth_bytes": t.by_class.get(k, 0)}
               for k in sorted(set(got_kind) | set(t.by_class))]
    return pairs, by_kind


#: labels of a ``workload_breakdown`` row (``zonemeter_workload_bytes_total``'s, in
#: :data:`tools.demo.cluster.WorkloadKey` order)
_BREAKDOWN = ("namespace", "workload", "workload_kind", "remote_kind", "client_zone",
              "remote_zone", "crossing", "direction")


def workload_breakdown(agents: AgentMetrics, seen: Mapping[WorkloadKey, int],
                       unseen: Mapping[WorkloadKey, int]) -> tuple[list[dict[str, Any]], int]:
    """Non-Service bytes per workload series, agents beside the lab.

    Rows: every series the lab expects (``seen_by_agents`` true), every series the agents
    have beyond it (ground truth 0) except a pod's traffic with its own node (link-scope
    packets the kernel sends: ``remote_kind="node"``, ``same_node``, when the lab sent no such
    bytes), and the lab's pairs no pod veth carries (``seen_by_agents`` false, ``bytes``
    0: the veth hook cannot see them).

    Returns:
        ``(rows, double_counted)``: rows with the labels of :data:`_BREAKDOWN`, ``bytes``,
        ``ground_truth_bytes`` and ``seen_by_agents``, sorted; ``double_counted``: what the
        agents report above the lab's bytes over the seen rows.
    """
    got: dict[WorkloadKey, int] = {}
    for (ns, wl, kind, cz, rz, rkind, crossing, direction), n in agents.workload_series.items():
        k: WorkloadKey = (ns, wl, kind, rkind, cz, rz, crossing, direction)
        got[k] = got.get(k, 0) + n
    rows = []
    double = 0
    for k in sorted(set(got) | set(seen)):
        n, want = got.get(k, 0), seen.get(k, 0)
        if not want and k[3] == "node" and k[6] == "same_node":
            continue  # link-scope packets of a pod's interface with its own node
        double += max(0, n - want)
        rows.append({**dict(zip(_BREAKDOWN, k, strict=True)), "bytes": n, "ground_truth_bytes": want,
                     "seen_by_agents": True})
    for k in sorted(unseen):
        rows.append({**dict(zip(_BREAKDOWN, k, strict=True)), "bytes": 0,
                     "ground_truth_bytes": unseen[k], "seen_by_agents": False})
    return rows, double


def _less(now: Mapping[tuple[str, str, str, str], int], before: Mapping[tuple[str, str, str, str], int]
          ) -> dict[tuple[str, str, str, str], int]:
    """``now - before`` per key, keys with nothing left dropped."""
    return {k: n - before.get(k, 0) for k, n in now.items() if n > before.get(k, 0)}


def _causes(ns: str, name: str, verdicts: list[Any], window: Mapping[tuple[str, str, str, str], int],
            t: ServiceTruth, seconds: float) -> list[dict[str, Any]]:
    """The ``hint_ignored_causes`` rows of one Service (see the module docstring): the
    agents' verdicts per (client node, cause) beside the lab's bytes of that node and cause
    (bytes since agent start, as the ground truth; the sentence's bytes/s from ``window``,
    the measured traffic's bytes per verdict; ``ground_truth_cause`` is the cause when the
    lab played it on that node, else None), then the (node, cause) pairs the lab played and
    the agents named not (``cause`` None, bytes 0)."""
    rows = []
    named = set()
    for v in verdicts:
        if (v.namespace, v.service) != (ns, name):
            continue
        named.add((v.client_node, v.cause))
        played = t.hint_ignored_by_cause.get((v.client_node, v.cause), 0)
        rows.append({"client_node": v.client_node, "cause": v.cause, "bytes": v.bytes,
                     "ground_truth_bytes": played,
                     "ground_truth_cause": v.cause if played else None,
                     "kube_proxy_version": v.kube_proxy_version,
                     "sentence": verdict_sentence(dataclasses.replace(v, bytes=window.get(
                         (v.namespace, v.service, v.client_node, v.cause), 0)), seconds)})
    for (node, cause), n in sorted(t.hint_ignored_by_cause.items()):
        if (node, cause) in named:
            continue
        rows.append({"client_node": node, "cause": None, "bytes": 0, "ground_truth_bytes": n,
                     "ground_truth_cause": cause, "kube_proxy_version": None, "sentence": ""})
    return rows


#: labels of a ``workloads`` row (``zonemeter_workload_bytes_total`` without crossing and
#: direction)
_WORKLOAD_ROW = ("namespace", "workload", "workload_kind", "remote_kind", "client_zone",
                 "remote_zone")


def workload_rows(agents: AgentMetrics, baseline: AgentMetrics | None,
                  seconds: float) -> list[dict[str, Any]]:
    """Non-Service bytes per (namespace, workload, workload_kind, remote_kind, client_zone,
    remote_zone), both directions, every crossing, with the cost of the measured window's
    cross-zone bytes (less ``baseline``'s, the warm-up) held for a month at AWS's price
    (:func:`usd_per_month_at_aws_price`, the Services' arithmetic) when AWS bills the
    remote's class (``billed``, ``reason``: :meth:`agent.report.pricing.Price.rule`).

    Returns:
        rows sorted by cross-zone bytes (largest first), then labels; the keys are
        :data:`_WORKLOAD_ROW`, ``bytes`` ({crossing: int}), ``cross_zone_bytes``,
        ``usd_per_month_at_aws_price``, ``billed`` and ``reason``.
    """
    def grouped(m: AgentMetrics | None) -> dict[tuple[str, ...], dict[str, int]]:
        out: dict[tuple[str, ...], dict[str, int]] = {}
        for (ns, wl, kind, cz, rz, rkind, crossing, _), n in (m.workload_series if m else {}).items():
            g = out.setdefault((ns, wl, kind, rkind, cz, rz), {})
            g[crossing] = g.get(crossing, 0) + n
        return out

    now, before = grouped(agents), grouped(baseline)
    rows = []
    for key, by in now.items():
        cz = by.get("cross_zone", 0)
        rule = AWS.rule(key[3])  # the remote's class (a pod's hop to a load balancer, ...)
        rows.append({**dict(zip(_WORKLOAD_ROW, key, strict=True)),
                     "bytes": {c: by[c] for c in _CROSSING_ORDER if c in by},
                     "cross_zone_bytes": cz,
                     "usd_per_month_at_aws_price": usd_per_month_at_aws_price(
                         cz - before.get(key, {}).get("cross_zone", 0), seconds)
                     if rule.billed else 0.0,
                     "billed": rule.billed, "reason": rule.reason})
    rows.sort(key=lambda r: (-r["cross_zone_bytes"], *(r[k] for k in _WORKLOAD_ROW)))
    return rows


def cost_by_class(agents: AgentMetrics, baseline: AgentMetrics | None, ns: str, name: str,
                  seconds: float) -> list[dict[str, Any]]:
    """One Service's cross-zone bytes per client class, each priced by AWS's rule for that
    class (:meth:`agent.report.pricing.Price.rule`): the measured window's bytes (less
    ``baseline``'s) held for a month, $0 for a class AWS does not bill.

    Both hops of a Service's bytes are priced, each by its own client's class: ``hop``
    ``endpoint`` (``zonemeter_service_bytes_total``) and ``entry`` (the first hop of a node
    port, ``zonemeter_service_entry_bytes_total``).

    Returns:
        ``[{"hop", "client_kind", "lb_type", "cross_zone_bytes" (since agent start, as the
        other byte counts), "billed", "usd_per_month_at_aws_price", "reason"}]`` for the
        classes with cross-zone bytes, largest first; ``lb_type`` ``""`` unless a load
        balancer.
    """
    def by_class(m: AgentMetrics | None) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        for hop, series in (("endpoint", m.service_classes if m else {}),
                            ("entry", m.entry_classes if m else {})):
            for (sns, sname, crossing, kind, lb), n in series.items():
                if (sns, sname) == (ns, name) and crossing == "cross_zone":
                    k = (hop, kind, lb if kind == "load-balancer" else "")
                    out[k] = out.get(k, 0) + n
        return out

    now, before = by_class(agents), by_class(baseline)
    rows = []
    for (hop, kind, lb), n in sorted(now.items(), key=lambda kv: (-kv[1], kv[0])):
        rule = AWS.rule(kind, lb)
        rows.append({"hop": hop, "client_kind": kind, "lb_type": lb, "cross_zone_bytes": n,
                     "billed": rule.billed,
                     "usd_per_month_at_aws_price": usd_per_month_at_aws_price(
                         n - before.get((hop, kind, lb), 0), seconds) if rule.billed else 0.0,
                     "reason": rule.reason})
    return rows


def usd_per_month_at_aws_price(cross_zone_bytes: int, seconds: float) -> float:
    """Extrapolate cross-zone bytes sent in ``seconds`` to USD per 30.44-day month at AWS's
    price ($0.01/GB on each side = $0.02 per GB crossing, GB = 1e9 bytes;
    ``agent.report.pricing``), rounded to cents. 0.0 when nothing crossed or no time passed.

    This is the lab's traffic rate held for a month, not a forecast of anyone's bill."""
    if cross_zone_bytes <= 0 or seconds <= 0:
        return 0.0
    return round(AWS.usd_per_month(cross_zone_bytes / seconds), 2)


def observed_cross_zone(agents: AgentMetrics, baseline: AgentMetrics | None, ns: str,
                        name: str) -> dict[str, float]:
    """Per client zone, the share (0..1) of the Service's bytes (both directions, every
    crossing) that crossed zones, over the agents' counts less ``baseline`` (warm-up).

    Returns:
        zone -> share, zones sorted; a zone without bytes in the window is absent.
    """
    cross: dict[str, int] = {}
    total: dict[str, int] = {}
    for key, n in agents.service_bytes.items():
        sns, sname, cz, _, crossing, _ = key
        if (sns, sname) != (ns, name):
            continue
        n -= 0 if baseline is None else baseline.service_bytes.get(key, 0)
        total[cz] = total.get(cz, 0) + n
        if crossing == "cross_zone":
            cross[cz] = cross.get(cz, 0) + n
    return {z: cross.get(z, 0) / total[z] for z in sorted(total) if total[z] > 0}


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value else "-"


def _n(value: int) -> str:
    return f"{value:,}"


def _locality(in_effect: Mapping[str, bool], zones: list[str]) -> str:
    if not in_effect:
        return "?"
    return "".join("Y" if in_effect.get(z) else ("n" if z in in_effect else "?") for z in zones)


def _exp_obs(s: Mapping[str, Any], zones: list[str]) -> str:
    """The X-ZONE cell: per zone in order, expected/observed cross-zone percentage (``-``
    where there is no figure)."""
    exp, obs = s.get("expected_cross_zone") or {}, s.get("observed_cross_zone") or {}

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{round(v * 100)}"

    return " ".join(f"{pct(exp.get(z))}/{pct(obs.get(z))}" for z in zones)


def render_table(summary: Mapping[str, Any], zones: list[str],
                 modes: Mapping[str, str] | None = None, title: str = "",
                 warning_messages: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """Return the per-Service table of a summary as text (one line per Service).

    Columns: Service, requested mode, locality per zone (``Y`` in effect, ``n`` not, in
    zone order), reason, per zone the expected and the observed cross-zone share in percent,
    the agents' cross-zone and hint-ignored bytes each beside the lab's ground truth (``=``
    equal, ``!`` different), same-node and same-zone bytes.
    """
    head = ["SERVICE", "MODE", "LOCAL", "REASON", "X-ZONE % EXP/OBS", "CROSS-ZONE (agents = lab)",
            "HINT-IGNORED (agents = lab)", "SAME-NODE", "SAME-ZONE", "$/MONTH AT AWS*"]
    rows = [head]
    for s in summary["services"]:
        key = f"{s['namespace']}/{s['name']}"
        cz, gcz = s["cross_zone_bytes"], s["ground_truth_cross_zone_bytes"]
        hi, ghi = s["hint_ignored_bytes"], s["ground_truth_hint_ignored_bytes"]
        rows.append([
            key, (modes or {}).get(key, ""), _locality(s["locality_in_effect"], zones),
            s["reason"], _exp_obs(s, zones),
            f"{_n(cz)} {'=' if cz == gcz else '!'} {_n(gcz)}",
            f"{_n(hi)} {'=' if hi == ghi else '!'} {_n(ghi)}",
            _n(s["bytes"].get("same_node", 0)), _n(s["bytes"].get("same_zone", 0)),
            _usd(s.get("usd_per_month_at_aws_price", 0.0)),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = {5, 6, 7, 8, 9}
    lines = [title] if title else []
    for r in rows:
        lines.append("  ".join(c.rjust(widths[i]) if i in right and r is not rows[0]
                               else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    lines.append(f"LOCAL: locality in effect per client zone ({', '.join(zones)}): Y yes, n no. "
                 "X-ZONE: per zone, the share of its calls expected to cross zones from the hints "
                 "(zonemeter_service_expected_cross_zone_ratio) / the share of its bytes that did. "
                 f"Bytes are L3 bytes (IP header included), both directions.")
    lines.append("* extrapolation: this run's cross-zone bytes/s (measured traffic, warm-up "
                 "left out) held for a 30.44-day month at AWS's $0.01/GB each side = $0.02 per GB "
                 "crossing, client classes AWS does not bill at $0; the lab's rate, not your bill.")
    lines += _class_lines(summary)
    lines += _workload_lines(summary)
    lines += _breakdown_lines(summary)
    lines.append(f"double-counted bytes: {_n(summary['double_counted_bytes'])}")
    lines += findings(summary, warning_messages)
    return "\n".join(lines)


def _class_lines(summary: Mapping[str, Any]) -> list[str]:
    """Cross-zone bytes of client classes AWS does not bill, one line per Service and class,
    with the rule's reason (nothing when every cross-zone byte is billed)."""
    out = []
    for s in summary["services"]:
        for c in s.get("cost_by_class", ()):
            if not c["billed"] and c["cross_zone_bytes"]:
                cls = " ".join(x for x in (c["client_kind"], c["lb_type"]) if x)
                out.append(f"  {s['namespace']}/{s['name']}: {_n(c['cross_zone_bytes'])} "
                           f"cross-zone bytes from {cls} at $0: {c['reason']}")
    return ["not billed (client class, agent.report.pricing):", *out] if out else []


def _workload_lines(summary: Mapping[str, Any], top: int = 5) -> list[str]:
    """Non-Service bytes beside the Services: the heaviest cross-zone workload rows and the
    cost total of both (nothing when the summary has no ``workloads``)."""
    rows = summary.get("workloads")
    if rows is None:
        return []
    usd = summary.get("usd_per_month_at_aws_price", {})
    out = [f"non-Service bytes (zonemeter_workload_bytes_total): "
           f"{_n(sum(r['cross_zone_bytes'] for r in rows))} cross-zone, "
           f"${usd.get('workloads', 0.0):,.2f}/month at AWS*; Services + non-Service: "
           f"${usd.get('total', 0.0):,.2f}/month"]
    for r in [r for r in rows if r["cross_zone_bytes"]][:top]:
        out.append(f"  {r['namespace']}/{r['workload']} ({r['workload_kind']}) -> "
                   f"{r['remote_kind']} {r['client_zone']}->{r['remote_zone']}: "
                   f"{_n(r['cross_zone_bytes'])} cross-zone, ${r['usd_per_month_at_aws_price']:,.2f}/month")
    return out


def _breakdown_lines(summary: Mapping[str, Any]) -> list[str]:
    """The per zone-pair comparison in one line per kind of traffic (Services' rows, the
    non-Service rows the lab expects), each row that differs, and the hops no pod veth
    carries (nothing when the summary has no breakdown)."""
    pairs = [r for s in summary.get("services", ()) for r in s.get("by_zone_pair", ())]
    entries = [r for s in summary.get("services", ()) for r in s.get("entry_by_client_kind", ())]
    rows = summary.get("workload_breakdown")
    if not pairs and not rows:
        return []
    seen = [r for r in rows or () if r["seen_by_agents"]]
    out = []
    for what, group in (("Service", pairs), ("node-port first-hop", entries), ("non-Service", seen)):
        if not group:
            continue
        differ = [r for r in group if r["bytes"] != r["ground_truth_bytes"]]
        out.append(f"{what} bytes per zone pair and direction: {len(group) - len(differ)} of "
                   f"{len(group)} equal to the lab's")
        for r in differ:
            who = (f"{r['namespace']}/{r['workload']} {r['remote_kind']} " if "workload" in r
                   else f"{r['client_kind']} " if "client_kind" in r else "")
            out.append(f"  ! {who}{r['client_zone']}->{r.get('server_zone', r.get('remote_zone'))} "
                       f"{r['direction']}: agents {_n(r['bytes'])}, lab {_n(r['ground_truth_bytes'])}")
    for r in rows or ():
        if not r["seen_by_agents"]:
            out.append(f"  unseen (no pod veth on the path): {r['namespace']}/{r['workload']} "
                       f"{r['direction']} with {r['remote_kind']} {r['remote_zone']}: "
                       f"{_n(r['ground_truth_bytes'])} bytes")
    return out


def findings(summary: Mapping[str, Any],
             warning_messages: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """Lines for each Service worth a look: cross-zone bytes while locality is off (with the
    reason code and one plain sentence saying what it means), hint-ignored bytes, and the hint
    model's warnings (code and, when ``warning_messages`` has it, the model's message).

    Args:
        summary: see :func:`build_summary`.
        warning_messages: Service key -> {warning code: message}
            (``ServiceDiagnosis.warnings``; see ``tools.demo.run.warning_messages``).
    """
    out = []
    for s in summary["services"]:
        key = f"{s['namespace']}/{s['name']}"
        off = sorted(z for z, on in s["locality_in_effect"].items() if not on)
        if s["cross_zone_bytes"] and off:
            out.append(f"  {key}: {_n(s['cross_zone_bytes'])} bytes crossed zones; locality "
                       f"is off in {', '.join(off)}")
            sentence = REASON_SENTENCES.get(s["reason"])
            out.append(f"    reason {s['reason']}" + (f": {sentence}" if sentence else ""))
        if s["hint_ignored_bytes"]:
            out.append(f"  {key}: {_n(s['hint_ignored_bytes'])} bytes ignored the hints "
                       "(sent to endpoints kube-proxy would not select for the client's node)")
            for c in s.get("hint_ignored_causes", ()):
                if c["sentence"]:
                    out.append(f"    {c['cause']}: {c['sentence']}")
        if s["warnings"]:
            out.append(f"  {key}: hint model warnings:")
            messages = (warning_messages or {}).get(key, {})
            for code in s["warnings"]:
                out.append(f"    {code}" + (f": {messages[code]}" if code in messages else ""))
    return ["findings:"] + out if out else []
