"""The lab's hints and kube-proxy selections from the upstream code (tools/oracle).

The lab (``tools.demo.cluster``) takes hints and each node's kube-proxy endpoints from the
oracle of its Kubernetes version when that binary is built, else from zonemeter's model, and
says which (:attr:`HintSource.line`). These tests run the demo's topologies through the real
oracle (they fail, not skip, when it is missing: CI builds it) and check that the model, which
the agents run, answers the same everywhere the lab goes: every disagreement would be a model
bug (:attr:`DemoCluster.disagreements`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent import hints as hint_model
from agent.errors import RuntimeFailure
from tests.fixtures.lab_hints import lab_hints
from tools.demo.cluster import KUBERNETES_VERSION, DemoCluster
from tools.demo.hintsource import hint_source
from tools.demo.topology import THREE_ZONE_API_TOPOLOGY, DemoSpec, load_demo, parse_demo

#: Auto with 4 endpoints in za and 1 each in zb, zc: za donates one endpoint to each (which
#: of za's endpoints goes to zb and which to zc follows Go map order upstream)
DONATING = THREE_ZONE_API_TOPOLOGY.replace(
    "  - {name: api-3, namespace: app, node: n3, app: api, ports: [{port: 8080}]}\n",
    "  - {name: api-3, namespace: app, node: n3, app: api, ports: [{port: 8080}]}\n"
    + "".join(f"  - {{name: api-{i}, namespace: app, node: n1, app: api, ports: [{{port: 8080}}]}}\n"
              for i in (4, 5, 6))).replace(
    "ports: [{port: 80, targetPort: 8080}]}",
    "ports: [{port: 80, targetPort: 8080}], annotations: {service.kubernetes.io/topology-mode: Auto}}")

SPECS = {
    "default": lambda: load_demo(),
    "default-ipv6": lambda: load_demo(ipv6=True),
    "three-zone-api": lambda: parse_demo(THREE_ZONE_API_TOPOLOGY),
    "auto-donating": lambda: parse_demo(DONATING),
    # LoadBalancer (externalTrafficPolicy Cluster and Local), a headless Service (kube-proxy
    # skips it: the oracle is not asked), dual stack
    "every-path": lambda: load_demo(Path(__file__).resolve().parents[3] / "docs" / "examples" / "every-path.yaml"),
}


def _hints(snapshot: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(o["addressType"], ep["targetRef"]["name"]): ep.get("hints")
            for o in snapshot["items"] if o["kind"] == "EndpointSlice" for ep in o["endpoints"]}


def _order_free(snapshot: dict[str, Any]) -> tuple[dict[tuple[str, str], Any], Counter[str]]:
    """Hints per endpoint with a donated zone hint (one that is not the endpoint's zone) shown
    as ``"donated"``, and the number of zone hints per zone: upstream's redistributeHints
    picks the receiving zone in Go map order, the rest is order-independent."""
    out: dict[tuple[str, str], Any] = {}
    per_zone: Counter[str] = Counter()
    for o in snapshot["items"]:
        if o["kind"] != "EndpointSlice":
            continue
        for ep in o["endpoints"]:
            zones = [z["name"] for z in (ep.get("hints") or {}).get("forZones") or []]
            per_zone.update(zones)
            donated = bool(zones) and zones != [ep.get("zone")]
            out[(o["addressType"], ep["targetRef"]["name"])] = "donated" if donated else ep.get("hints")
    return out, per_zone


def _cluster(spec: DemoSpec, tmp_path: Path, kind: str) -> DemoCluster:
    d = tmp_path / kind
    d.mkdir(exist_ok=True)
    return DemoCluster(spec, d, hints=lab_hints(kind), prefix="zmorc", state_dir=d / "state")


def test_source_line_names_the_oracle_or_the_build_command(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    src = lab_hints("oracle")
    assert src.kind == "oracle"
    assert src.line == f"hints and kube-proxy endpoints: upstream oracle {KUBERNETES_VERSION} (tools/oracle)"
    assert hint_source("auto").kind == "oracle"  # built, so auto takes it
    assert hint_source("model").line == ("hints and kube-proxy endpoints: zonemeter's model "
                                         "(--hints model)")
    monkeypatch.setenv("ZONEMETER_ORACLE_CACHE", str(tmp_path))  # nothing built there
    auto = hint_source("auto")
    assert auto.kind == "model"
    assert auto.line == ("hints and kube-proxy endpoints: zonemeter's model (oracle not built: "
                         f"bash tools/oracle/build.sh {KUBERNETES_VERSION})")
    with pytest.raises(RuntimeFailure, match=f"run: bash tools/oracle/build.sh {KUBERNETES_VERSION}"):
        hint_source("oracle")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_lab_follows_the_oracle_and_the_model_agrees(name: str, tmp_path: Path) -> None:
    spec = SPECS[name]()
    up, mo = _cluster(spec, tmp_path, "oracle"), _cluster(spec, tmp_path, "model")
    try:
        up.write_snapshot()
        mo.write_snapshot()
        assert up.disagreements == []
        assert _order_free(up.snapshot) == _order_free(mo.snapshot)
        if name == "auto-donating":
            assert "donated" in _order_free(up.snapshot)[0].values()
            for um, mm in zip(up.models.values(), mo.models.values(), strict=True):
                assert dataclasses.replace(um, selection={}) == dataclasses.replace(mm, selection={})
                assert {n: len(p) for n, p in um.selection.items()} == \
                    {n: len(p) for n, p in mm.selection.items()}
        else:
            assert _hints(up.snapshot) == _hints(mo.snapshot)
            assert up.models == mo.models
        if name.startswith("three-zone"):  # every locality setting the live flip uses
            for td in ("PreferClose", "PreferSameZone", "PreferSameNode"):
                a = up.plan_locality("app/api", traffic_distribution=td)
                b = mo.plan_locality("app/api", traffic_distribution=td)
                assert dict(a.after.selection) == dict(b.after.selection), td
                assert _hints(a.snapshot) == _hints(b.snapshot), td
            auto = {"service.kubernetes.io/topology-mode": "Auto"}
            assert up.plan_locality("app/api", annotations=auto).after.selection == \
                mo.plan_locality("app/api", annotations=auto).after.selection
            assert up.disagreements == []
    finally:
        up.close()


def test_upstream_answers_the_demo_relies_on(tmp_path: Path) -> None:
    """What upstream 1.37 does with the default demo cluster (the e2e tests' expectations)."""
    spec = load_demo()
    c = _cluster(spec, tmp_path, "oracle")
    try:
        c.write_snapshot()
        m = c.models
    finally:
        c.close()
    assert m["shop/checkout"].selection["c2"] == ("checkout-c1", "checkout-c2")
    assert m["shop/node-cache"].selection["b2"] == ("node-cache-b2",)
    assert m["shop/catalog"].selection["a1"] == tuple(sorted(spec.topology.service("catalog").endpoints))
    assert m["shop/cart"].selection["a1"] == tuple(sorted(spec.topology.service("cart").endpoints))
    hinted = _hints(c.snapshot)
    assert hinted[("IPv4", "node-cache-b2")] == {"forZones": [{"name": "zone-b"}], "forNodes": [{"name": "b2"}]}
    assert hinted[("IPv4", "cart-1")] is None  # Auto refused upstream too


def test_a_model_that_answers_otherwise_is_reported_and_the_oracle_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately wrong model (no hints written; node b2's kube-proxy sends nowhere) is
    named line by line, while the lab keeps upstream's hints and selection."""
    real_hints, real_eval = hint_model.controller_hints, hint_model.evaluate_cluster

    def no_hints(svc: Any, slices: Any, nodes: Any, **kw: Any) -> Any:
        new, events = real_hints(svc, slices, nodes, **kw)
        for s in new:
            for ep in s.get("endpoints") or []:
                ep.pop("hints", None)
        return new, events

    def b2_drops(*args: Any, **kw: Any) -> Any:
        out = []
        for d in real_eval(*args, **kw):
            if d.name == "node-cache":
                proxy = {n: d.proxy[n] for n in d.proxy}
                proxy["b2"] = dataclasses.replace(proxy["b2"], internal_addresses=frozenset())
                d = dataclasses.replace(d, proxy=proxy)
            out.append(d)
        return out

    monkeypatch.setattr(hint_model, "controller_hints", no_hints)
    monkeypatch.setattr(hint_model, "evaluate_cluster", b2_drops)
    c = _cluster(load_demo(), tmp_path, "oracle")
    try:
        c.write_snapshot()
    finally:
        c.close()
    text = "\n".join(c.disagreements)
    assert "Service shop/node-cache: IPv4 hints of Pod node-cache-b2: model forZones [] forNodes [], " \
           "upstream forZones ['zone-b'] forNodes ['b2']" in text
    assert "Service shop/node-cache (IPv4) node b2: kube-proxy endpoints: model [], upstream ['10.244.4.6']" in text
    assert c.models["shop/node-cache"].selection["b2"] == ("node-cache-b2",)
    assert _hints(c.snapshot)[("IPv4", "node-cache-b2")] is not None
