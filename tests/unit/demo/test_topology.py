"""The demo's embedded cluster and its traffic section (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import InputError
from tests.fixtures.lab_hints import lab_hints
from tools.demo.cluster import controller_snapshot, evaluate
from tools.demo.topology import DEFAULT_DEMO_TOPOLOGY, load_demo, parse_demo
from tools.lab import Lab


def test_default_is_issue_5_cluster() -> None:
    spec = load_demo()
    topo = spec.topology
    assert [z.name for z in topo.zones] == ["zone-a", "zone-b", "zone-c"]
    assert [(n.name, n.zone, n.cpu) for n in topo.nodes] == [
        ("a1", "zone-a", 4), ("a2", "zone-a", 4), ("b1", "zone-b", 4), ("b2", "zone-b", 4),
        ("c1", "zone-c", 4), ("c2", "zone-c", 4)]
    assert [n.name for n in topo.nodes if n.ignore_hints] == ["c2"]
    count = {s.name: len(s.endpoints) for s in topo.services}
    assert count == {"catalog": 6, "cart": 8, "checkout": 6, "node-cache": 6, "payments": 4}
    for name in ("catalog", "checkout", "node-cache"):
        assert sorted(topo.pod(p).node for p in topo.service(name).endpoints) == \
            ["a1", "a2", "b1", "b2", "c1", "c2"]
    assert topo.service("cart").annotations == {"service.kubernetes.io/topology-mode": "Auto"}
    assert topo.service("checkout").traffic_distribution == "PreferSameZone"
    assert topo.service("node-cache").traffic_distribution == "PreferSameNode"
    pay = topo.service("payments")
    assert pay.traffic_distribution == "PreferSameZone" and pay.annotations
    plan = spec.traffic
    assert [topo.pod(c).node for c in plan.clients] == ["a1", "a2", "b1", "b2", "c1", "c2"]
    assert plan.services == tuple(s.key for s in topo.services)
    assert plan.families == (4,)


def test_default_model_answers() -> None:
    """The hint model's verdicts the demo relies on (computed, not root); the selections are
    the model's own (the oracle's are pinned in test_oracle_lab.py)."""
    spec = load_demo()
    lab = Lab(spec.topology, prefix="zmunit")  # not built: snapshot() needs no root
    model = lab_hints("model")
    models = evaluate(controller_snapshot(lab, model), spec.topology, model)
    assert models["shop/cart"].reason == "min-allocation-exceeds-overload-threshold"
    assert not any(models["shop/cart"].filtering.values())
    assert models["shop/payments"].reason == "min-allocation-exceeds-overload-threshold"
    assert models["shop/checkout"].selection["c2"] == ("checkout-c1", "checkout-c2")
    assert models["shop/node-cache"].selection["b2"] == ("node-cache-b2",)
    assert all(models["shop/node-cache"].filtering.values())
    assert models["shop/catalog"].selection["a1"] == tuple(
        sorted(spec.topology.service("catalog").endpoints))


def _with_traffic(section: str) -> str:
    head, _, _ = DEFAULT_DEMO_TOPOLOGY.partition("traffic:")
    return head + section


@pytest.mark.parametrize("section, field", [
    ("traffic: {rate: 0}\n", "rate"),
    ("traffic: {requestBytes: 4}\n", "requestBytes"),
    ("traffic: {family: 6}\n", "family"),
    ("traffic: {family: 5}\n", "family"),
    ("traffic: {clients: {app: nobody}}\n", "clients"),
    ("traffic: {services: [shop/nope]}\n", "services[0]"),
    ("traffic: {bogus: 1}\n", "bogus"),
    ("traffic: [1]\n", "traffic"),
])
def test_bad_traffic_names_field(section: str, field: str) -> None:
    with pytest.raises(InputError) as err:
        parse_demo(_with_traffic(section), "demo.yaml")
    assert err.value.source == "demo.yaml" and err.value.obj == "traffic"
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_client_that_is_an_endpoint_is_refused() -> None:
    with pytest.raises(InputError, match="no hairpin"):
        parse_demo(_with_traffic("traffic: {clients: {app: catalog}, services: [shop/catalog]}\n"))


def test_pod_backing_two_services_is_refused() -> None:
    text = DEFAULT_DEMO_TOPOLOGY.replace(
        "  - name: cart\n    namespace: shop\n    selector: {app: cart}",
        "  - name: cart\n    namespace: shop\n    selector: {app: catalog}")
    with pytest.raises(InputError, match="backs both"):
        parse_demo(text)


def test_overrides_and_ipv6_traffic() -> None:
    spec = parse_demo(_with_traffic("traffic: {family: both, rate: 2.5}\n"), ipv6=True,
                      mode="vxlan")
    assert spec.topology.options.mode == "vxlan" and spec.topology.options.ipv6
    assert spec.traffic.families == (4, 6) and spec.traffic.rate == 2.5


def test_topology_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEFAULT_DEMO_TOPOLOGY.replace("cpu: 4}\n  - {name: a2", "cpu: 4}\n  - {name: A2"))
    with pytest.raises(InputError) as err:
        load_demo(bad)
    assert err.value.source == str(bad) and "nodes" in str(err.value)
    with pytest.raises(InputError, match="cannot read"):
        load_demo(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("[1, 2]\n")
    with pytest.raises(InputError, match="must be a mapping"):
        load_demo(tmp_path / "list.yaml")


def test_docs_example_parses() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "demo.md").read_text()
    block = text.split("A complete small example", 1)[1].split("```yaml\n", 1)[1].split("```")[0]
    spec = parse_demo(block, "docs/demo.md")
    assert spec.traffic.families == (4, 6) and spec.topology.options.mode == "vxlan"
    assert [n.name for n in spec.topology.nodes if n.ignore_hints] == ["n2"]


def test_ipv6_flag_sends_both_families_unless_the_file_asks_for_ipv6_only() -> None:
    from tools.demo.topology import DEFAULT_DEMO_TOPOLOGY, load_demo, parse_demo

    assert load_demo().traffic.families == (4,)
    assert load_demo(ipv6=True).traffic.families == (4, 6)  # the default file says family: 4
    six = DEFAULT_DEMO_TOPOLOGY.replace("options: {mode: flat, ipv6: false}", "options: {mode: flat, ipv6: true}")
    six = six.replace("  family: 4\n", "  family: 6\n")
    assert "  family: 6\n" in six
    assert parse_demo(six, ipv6=True).traffic.families == (6,)
    bare = DEFAULT_DEMO_TOPOLOGY.split("\ntraffic:")[0]  # no traffic section at all
    assert parse_demo(bare, ipv6=True).traffic.families == (4, 6)
