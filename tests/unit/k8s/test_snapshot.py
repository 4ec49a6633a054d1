"""agent.k8s.snapshot: kubectl dumps in JSON and YAML, and clear errors for bad ones."""

from __future__ import annotations

import json

import pytest

from agent.errors import InputError
from agent.k8s import snapshot
from tests.fixtures import k8s


def _node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def test_kubectl_list_json_sorted_by_kind() -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        _node("n1"),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}},
    ]}
    snap = snapshot.load_text(json.dumps(doc), "dump.json")
    assert [n["metadata"]["name"] for n in snap.nodes] == ["n1"]
    assert [s["metadata"]["name"] for s in snap.services] == ["s"]
    assert snap.ignored == 1


def test_multi_document_yaml_and_typed_list() -> None:
    text = "kind: NodeList\nitems:\n- metadata: {name: a}\n---\nkind: Pod\nmetadata: {name: p, namespace: x}\n"
    snap = snapshot.load_text(text, "dump.yaml")
    assert snap.nodes[0]["kind"] == "Node"
    assert snap.pods[0]["metadata"]["name"] == "p"


@pytest.mark.parametrize("text, needle", [
    ("{not json", "dump: invalid JSON at line 1"),
    ("a: [1, 2\n", "dump: invalid YAML"),
    ('{"kind": "List", "items": [{"kind": "Node", "metadata": {}}]}', "metadata.name"),
    ('{"kind": "List", "items": 3}', "items: must be a list"),
    ('[{"metadata": {"name": "x"}}]', "kind: missing"),
])
def test_bad_input_is_one_line_naming_the_field(text: str, needle: str) -> None:
    with pytest.raises(InputError) as info:
        snapshot.load_text(text, "dump")
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_unreadable_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="cannot read"):
        snapshot.load(tmp_path / "missing.json")


def test_builders_produce_objects_the_snapshot_loader_accepts() -> None:
    """The fixture builders, with the fields a real object carries (noise), load as one of each kind."""
    items = [k8s.node("n1", "zone-a", internal="10.1.0.1", region="region-1", noise=True),
             k8s.pod("p", "10.0.0.1", "n1", namespace="ns", noise=True),
             k8s.service("s", "ns", cluster_ip="10.96.0.1", ports=[{"port": 80}], selector={}, noise=True),
             k8s.endpointslice("s-1", "s", [k8s.endpoint("10.0.0.1", "zone-a", "n1", conditions={"ready": True},
                                                          target="x", target_namespace="y")],
                               namespace="ns", ports=[{"port": 8080}], noise=True)]
    snap = snapshot.load_text(json.dumps({"kind": "List", "items": items}), "built")
    assert (len(snap.nodes), len(snap.pods), len(snap.services), len(snap.endpointslices)) == (1, 1, 1, 1)
