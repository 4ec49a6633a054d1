"""agent.attribution.verdict: hint-ignored bytes split into causes by the client node's evidence."""

from __future__ import annotations

from agent.attribution.verdict import CAUSES, HintVerdict, hint_verdicts, verdict_sentence


def causes(ignored, paths, versions=None):  # type: ignore[no-untyped-def]
    return [(v.service, v.client_node, v.cause, v.bytes) for v in hint_verdicts(ignored, paths, versions)]


def test_clusterip_calls_from_a_node_that_ignores_hints_are_its_data_plane() -> None:
    ignored = {("shop", "web", "c2", "pod"): 6000}
    paths = {("shop", "web", "c2", "clusterip"): 9000, ("shop", "web", "c1", "clusterip"): 5000}
    assert causes(ignored, paths) == [("web", "c2", "data-plane", 6000)]


def test_direct_dials_are_client_side_and_the_rest_data_plane() -> None:
    ignored = {("shop", "web", "n1", "pod"): 1000}
    paths = {("shop", "web", "n1", "direct"): 300, ("shop", "web", "n1", "clusterip"): 5000}
    assert causes(ignored, paths) == [("web", "n1", "data-plane", 700), ("web", "n1", "client-side", 300)]
    # direct dials only (no ClusterIP call seen): every byte is the clients' choice, even
    # when the two agents' counts differ a little (scrapes a moment apart)
    assert causes({("shop", "web", "n1", "pod"): 1000}, {("shop", "web", "n1", "direct"): 990}) == [
        ("web", "n1", "client-side", 1000)]
    # more direct bytes than hint-ignored ones: never more than the hint-ignored bytes
    assert causes({("shop", "web", "n1", "pod"): 10}, {("shop", "web", "n1", "direct"): 99}) == [
        ("web", "n1", "client-side", 10)]


def test_node_address_clients_are_external_and_no_evidence_is_unknown() -> None:
    ignored = {("shop", "web", "n1", "node"): 50, ("shop", "web", "other", "pod"): 7,
               ("shop", "web", "n2", "pod"): 0, ("shop", "db", "n3", "unknown"): 4}
    assert causes(ignored, {}) == [("db", "n3", "unknown", 4), ("web", "n1", "external", 50),
                                   ("web", "other", "unknown", 7)]


def test_sentences_name_the_node_the_rate_and_the_kube_proxy_version() -> None:
    [v] = hint_verdicts({("shop", "web", "c2", "pod"): 6000}, {("shop", "web", "c2", "clusterip"): 1},
                        {"c2": "v1.26.3"})
    assert v.kube_proxy_version == "v1.26.3"
    assert verdict_sentence(v, 60.0) == (
        "locality configured, but node c2's data plane ignores the hints (100 bytes/s, "
        "kube-proxy v1.26.3 there)")
    cs = HintVerdict("shop", "web", "n1", "client-side", 2500)
    assert verdict_sentence(cs).startswith("clients of this Service on node n1 choose endpoints themselves")
    assert "2,500 bytes" in verdict_sentence(cs)
    assert "NodePort" in verdict_sentence(HintVerdict("shop", "web", "n1", "external", 1))
    assert set(CAUSES) == {"data-plane", "client-side", "external", "unknown"}
