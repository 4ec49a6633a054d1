"""Turn the shared reference vectors (vectors/hints.json, docs/hints.md) into Kubernetes
API-shaped objects and compare results.

A vector (schema: docs/hints.md) becomes a Node list, one Service (``vec/svc``) and its
EndpointSlices, exactly as ``kubectl get -o json`` would show them; the expectations are then
checked against ``zonemeter explain -o json`` output (and, for fields the explain JSON does not
carry, against the :class:`agent.hints.ServiceDiagnosis` of the same objects).
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

from agent import hints

REPO = Path(__file__).resolve().parents[3]
#: the copy kept in the repository, so a clone anywhere runs the vector tests; while the
#: shared file is beside the clone it is the one read, and test_vendored_copy_is_the_shared_file
#: fails when the two differ
VENDORED_PATH = Path(__file__).resolve().parent / "vectors" / "hints.json"


def shared_vectors_path() -> Path | None:
    """``shared/vectors/hints.json`` beside the clone (CI) or beside a parent (git
    worktrees), or None when there is none."""
    for d in REPO.parents:
        p = d / "shared" / "vectors" / "hints.json"
        if p.is_file():
            return p
    return None


#: the reference vectors read: the shared file when beside the clone, else the vendored copy
VECTORS_PATH = shared_vectors_path() or VENDORED_PATH
NS, SVC = "vec", "svc"
LOCAL_NODE_PORT = 30080


def load_vectors() -> list[dict[str, Any]]:
    """All vectors of the reference file (:data:`VECTORS_PATH`)."""
    vectors: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text())["vectors"]
    return vectors


_GATE_GUESS = {30: "ServiceTrafficDistribution", 31: "ServiceTrafficDistribution",
               32: "ServiceTrafficDistribution", 33: "PreferSameTrafficDistribution"}


def versions_for(vector: dict[str, Any]) -> list[tuple[str, dict[str, bool]]]:
    """Every (version, feature-gate overrides) the vector's ``versions`` text claims.

    ``"1.31-1.35 (1.30 with ServiceTrafficDistribution gate)"`` gives 1.31..1.35 with the
    vector's gates and 1.30 with that gate turned on; ``"(default gates)"`` adds nothing.
    """
    text = vector["versions"]
    main, _, paren = text.partition("(")
    base = vector["input"].get("feature_gates") or {}
    minors: dict[int, dict[str, bool]] = {}
    for m in re.finditer(r"1\.(\d+)(?:-1\.(\d+))?", main):
        a = int(m.group(1))
        b = int(m.group(2) or a)
        for minor in range(a, b + 1):
            minors[minor] = {}
    for m in re.finditer(r"1\.(\d+)\s+(?:with|needs)\s+([A-Za-z]*)\s*gate", paren):
        minor = int(m.group(1))
        gate = m.group(2) or _GATE_GUESS[minor]
        minors[minor] = {gate: True}
    if "gate on" in paren:
        for m in re.finditer(r"1\.(\d+)\s*\(gate on\)", text):
            minors[int(m.group(1))] = {_GATE_GUESS[int(m.group(1))]: True}
    out = []
    for minor in sorted(minors):
        gates = {g: v for g, v in base.items() if hints._gate_default(g, minor) is not None}
        gates.update(minors[minor])
        out.append((f"1.{minor}", gates))
    return out


def _address(name: str, index: int, family: str) -> str:
    try:
        ip = ipaddress.ip_address(name)
        if (ip.version == 6) == (family == "IPv6"):
            return name
    except ValueError:
        pass
    if family == "IPv6":
        return f"fd00::{index + 1:x}"
    return f"10.250.{(index >> 8) & 255}.{index & 255}"


def _node(name: str, zone: str | None, ready: bool = True, cpu: str | None = "4",
          control_plane: bool = False, master: bool = False) -> dict[str, Any]:
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    if zone is not None:
        labels[hints.LABEL_ZONE] = zone
    if control_plane:
        labels["node-role.kubernetes.io/control-plane"] = ""
    if master:
        labels["node-role.kubernetes.io/master"] = ""
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if cpu is not None:
        status["allocatable"] = {"cpu": cpu, "memory": "16Gi"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": status}


def _hints(zones: list[str] | None, nodes: list[str] | None) -> dict[str, Any] | None:
    if zones is None and nodes is None:
        return None
    h: dict[str, Any] = {}
    if zones is not None:
        h["forZones"] = [{"name": z} for z in zones]
    if nodes is not None:
        h["forNodes"] = [{"name": n} for n in nodes]
    return h


def _endpoint(addr: str, ready: Any, zone: str | None, node: str | None,
              hints_: dict[str, Any] | None, serving: Any = "absent", terminating: Any = "absent") -> dict[str, Any]:
    cond: dict[str, Any] = {}
    if ready is not None:
        cond["ready"] = ready
    if serving not in ("absent", None):
        cond["serving"] = serving
    if terminating not in ("absent", None):
        cond["terminating"] = terminating
    ep: dict[str, Any] = {"addresses": [addr], "conditions": cond}
    if zone is not None:
        ep["zone"] = zone
    if node is not None:
        ep["nodeName"] = node
    if hints_ is not None:
        ep["hints"] = hints_
    return ep


def _slice(name: str, family: str, port: int, endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
            "metadata": {"name": name, "namespace": NS,
                         "labels": {hints.LABEL_SERVICE_NAME: SVC,
                                    hints.LABEL_MANAGED_BY: hints.CONTROLLER_NAME}},
            "ports": [{"name": "", "port": port, "protocol": "TCP"}], "endpoints": endpoints}


def _service(sv: dict[str, Any], family: str) -> dict[str, Any]:
    stype = sv.get("type", "ClusterIP")
    port: dict[str, Any] = {"name": "", "port": 80, "targetPort": 80, "protocol": "TCP"}
    if stype in ("NodePort", "LoadBalancer"):
        port["nodePort"] = LOCAL_NODE_PORT
    spec: dict[str, Any] = {"type": stype, "selector": {"app": SVC}, "ports": [port],
                            "ipFamilies": [family], "clusterIP": "10.96.0.10" if family == "IPv4" else "fd00:96::a"}
    if sv.get("trafficDistribution") is not None:
        spec["trafficDistribution"] = sv["trafficDistribution"]
    for k in ("internalTrafficPolicy", "externalTrafficPolicy"):
        if sv.get(k) is not None:
            spec[k] = sv[k]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SVC, "namespace": NS, "annotations": dict(sv.get("annotations") or {})},
            "spec": spec}


class Case:
    """A vector expressed as Kubernetes objects plus the explain arguments to use."""

    def __init__(self, vector: dict[str, Any]) -> None:
        self.vector = vector
        inp = vector["input"]
        self.kind = vector["kind"]
        self.addr_of: dict[str, str] = {}
        self.name_of: dict[str, str] = {}
        self.node: str | None = None
        self.hints_populated = [f"{NS}/{SVC}"] if inp.get("previously_enabled") else []
        if self.kind == "proxy-selection":
            self._proxy(inp)
        else:
            self._controller(inp)

    def _controller(self, inp: dict[str, Any]) -> None:
        family = inp.get("address_type", "IPv4")
        self.nodes = [_node(n["name"], n.get("zone"), n.get("ready", True), n.get("allocatable_cpu"),
                            n.get("control_plane", False), n.get("master_label", False))
                      for n in inp.get("nodes", [])]
        self.service = _service(inp["service"], family)
        groups = inp.get("slices") or [{"name": f"{SVC}-1", "endpoints": inp.get("endpoints", [])}]
        self.slices = []
        index = 0
        for g in groups:
            eps = []
            for e in g["endpoints"]:
                addr = _address(e["name"], index, family)
                index += 1
                self.addr_of[e["name"]] = addr
                self.name_of[addr] = e["name"]
                h = e.get("hints")
                eps.append(_endpoint(addr, e.get("ready"), e.get("zone"), e.get("node"),
                                     _hints(h.get("forZones"), h.get("forNodes")) if h else None))
            self.slices.append(_slice(g["name"], family, 80, eps))

    def _proxy(self, inp: dict[str, Any]) -> None:
        local = inp["local_node"]
        self.node = local["name"]
        self.nodes = [_node(local["name"], local.get("zone"))]
        by_port: dict[tuple[str, int], list[dict[str, Any]]] = {}
        family = "IPv4"
        for e in inp["endpoints"]:
            host, _, port = e["ip"].rpartition(":")
            family = "IPv6" if ":" in host.strip("[]") else "IPv4"
            self.addr_of[e["ip"]] = host.strip("[]")
            by_port.setdefault((family, int(port)), []).append(_endpoint(
                host.strip("[]"), e.get("ready"), None, e.get("node"),
                _hints(e.get("zone_hints"), e.get("node_hints")),
                e.get("serving"), e.get("terminating")))
        self.service = _service(inp["service"], family)
        self.slices = [_slice(f"{SVC}-{i + 1}", fam, port, eps)
                       for i, ((fam, port), eps) in enumerate(sorted(by_port.items()))]

    def objects(self) -> list[dict[str, Any]]:
        """Everything, as items of a kubectl ``List``."""
        return [*self.nodes, self.service, *self.slices]

    def write(self, path: Path, yaml_format: bool = False) -> Path:
        """Write a kubectl-style dump (JSON List, or multi-document YAML)."""
        if yaml_format:
            import yaml

            path.write_text(yaml.safe_dump_all(self.objects(), sort_keys=False))
        else:
            path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": self.objects()}))
        return path


def norm_hints(h: dict[str, Any] | None) -> dict[str, list[str]] | None:
    """Vector/explain hints with absent keys as empty lists."""
    if h is None:
        return None
    return {"forZones": list(h.get("forZones", [])), "forNodes": list(h.get("forNodes", []))}


def check_controller(case: Case, svc_json: dict[str, Any], diag: hints.ServiceDiagnosis) -> None:
    """Assert an auto-hints or traffic-distribution vector against explain JSON and model."""
    exp = case.vector["expected"]
    ctrl = svc_json["controller"]
    got_hints = {case.name_of[a]: h for a, h in ctrl["hints"].items()}
    assert set(got_hints) == set(exp["hints"]), "endpoint set"
    assert ctrl["events"] == exp["events"], "events"
    if case.kind == "traffic-distribution":
        assert svc_json["mechanism"] == exp["mechanism"], "mechanism"
        for name, h in exp["hints"].items():
            assert norm_hints(got_hints[name]) == norm_hints(h), f"hints of {name}"
        return
    assert ctrl["hints_enabled"] is exp["hints_enabled"], "hints_enabled"
    assert svc_json["mechanism"] == ("topology-mode-annotation" if exp["hints_enabled"]
                                     else "topology-mode-annotation (refused)")
    assert ctrl["zone_cpu_ratios"] == exp.get("zone_cpu_ratios"), "zone_cpu_ratios"
    assert diag.controller.ready_endpoint_count == exp["ready_endpoint_count"], "ready_endpoint_count"
    if "allocations" in exp:
        assert ctrl["allocations"] == exp["allocations"], "allocations"
    else:
        assert ctrl["allocations"] is None
    if "minimums" in exp:
        assert dict(diag.controller.minimums or {}) == exp["minimums"], "minimums"
        assert diag.controller.sum_of_minimums == exp["sum_of_minimums"], "sum_of_minimums"
    deterministic = exp.get("deterministic", True)
    for name, h in exp["hints"].items():
        got = got_hints[name]
        if h is None:
            assert got is None, f"hints of {name}"
            continue
        assert got is not None and got["forNodes"] == [], f"hints of {name}"
        if "forZones_one_of" in h:
            assert len(got["forZones"]) == 1 and got["forZones"][0] in h["forZones_one_of"], name
        elif deterministic:
            assert got["forZones"] == h["forZones"], f"hints of {name}"
    ready = {e["name"] for s in (case.vector["input"].get("slices")
                                 or [{"endpoints": case.vector["input"].get("endpoints", [])}])
             for e in s["endpoints"] if e.get("ready") is True}
    zone_of = {e["name"]: e.get("zone") for s in (case.vector["input"].get("slices")
               or [{"endpoints": case.vector["input"].get("endpoints", [])}]) for e in s["endpoints"]}
    if "hint_counts_by_zone" in exp:
        counts: dict[str, int] = {}
        for name in ready:
            for z in (got_hints[name] or {}).get("forZones", []):
                counts[z] = counts.get(z, 0) + 1
        assert counts == exp["hint_counts_by_zone"], "hint_counts_by_zone"
    if "cross_zone_hints" in exp:
        cross = sum(1 for n in ready if got_hints[n] and got_hints[n]["forZones"] != [zone_of[n]])
        assert cross == exp["cross_zone_hints"], "cross_zone_hints"
    if "unchanged_slices_kept" in exp:
        assert list(diag.controller.kept_unchanged) == exp["unchanged_slices_kept"]


def check_proxy(case: Case, svc_json: dict[str, Any], diag: hints.ServiceDiagnosis) -> None:
    """Assert a proxy-selection vector against explain JSON (``proxy[local node]``) and model."""
    exp = case.vector["expected"]
    got = svc_json["proxy"][case.node]
    assert set(svc_json["proxy"]) == {case.node}
    assert got["topology_mode"] == exp["topology_mode"], "topology_mode"
    empty = not case.vector["input"]["endpoints"]
    for key in ("cluster_endpoints", "local_endpoints"):
        if empty:
            assert (got[key] or []) == (exp[key] or []), key
        else:
            assert got[key] == exp[key], key
    assert got["internal_traffic"] == exp["internal_traffic"], "internal_traffic"
    assert got["external_traffic"] == exp["external_traffic"], "external_traffic"
    decision = diag.proxy[case.node]
    assert list(decision.all_reachable_endpoints) == exp["all_reachable_endpoints"]
    assert decision.has_any_endpoints is exp["has_any_endpoints"]
    view = diag.proxy_view(case.node)
    assert view is not None and view.internal_traffic == exp["internal_traffic"]
    if exp["internal_traffic"] in ("DROP", "REJECT"):
        assert view.selected == frozenset()
    else:
        chosen = exp["local_endpoints"] if exp["internal_traffic"] == "local" else exp["cluster_endpoints"]
        assert view.selected == frozenset(case.addr_of[k] for k in chosen)
