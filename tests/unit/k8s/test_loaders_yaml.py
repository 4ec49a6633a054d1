"""Attack the YAML paths of the snapshot and CIDR loaders with tags (bad input: docs/reliability.md).

PyYAML's safe constructors raise plain ``ValueError``/``KeyError``/``AttributeError`` for
a tagged scalar that is not of its type (``!!int x``, ``!!bool maybe``, ``!!timestamp
foo``), and an unquoted date-like scalar that is no date (``2024-02-30``, implicitly a
timestamp) did the same: tracebacks instead of one line. Valid dates became ``datetime``
objects (no JSON value) in the objects handed to the cache and the hint model.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import InputError
from agent.k8s.cidrs import parse_zone_cidrs
from agent.k8s.snapshot import load_text

TAGGED = st.sampled_from([
    "!!float abc", "!!int x", "!!bool maybe", "!!timestamp foo", "!!timestamp 2001-13-45",
    "2001-13-45", "2024-02-30", "2024-01-01", "2024-01-01T10:00:00Z", "!!binary '%%%'",
    "!!binary aGVsbG8=", "!!set {a}", "!!omap [a]", "!!pairs 5", "!custom a",
    "!!python/name:os.system x", "!!python/object/apply:os.system [ls]", "!!str 5", "!!null ''",
    "!!int 99999999999999999999", "!!float 1e999", "!!merge x", "!!map {}", "!!seq []",
    "plain", "'quoted'", "12", "0x1F", "yes", "~",
])

NODE = """\
kind: Node
metadata:
  name: {name}
  labels:
    topology.kubernetes.io/zone: {zone}
    other: {other}
spec:
  podCIDRs: [{cidr}]
"""


def _one_line(err: InputError, source: str) -> None:
    assert "\n" not in str(err) and source in str(err)


@settings(max_examples=300, deadline=None)
@given(TAGGED, TAGGED, TAGGED, TAGGED)
def test_snapshot_yaml_with_any_tag_loads_json_values_or_fails_in_one_line(
        name: str, zone: str, other: str, cidr: str) -> None:
    text = NODE.format(name=name, zone=zone, other=other, cidr=cidr)
    try:
        snap = load_text(text, "dump.yaml")
    except InputError as err:
        _one_line(err, "dump.yaml")
        return
    # whatever loaded is plain JSON (what the API server would have sent)
    json.dumps(snap.nodes, allow_nan=True)


def test_dates_stay_text_as_in_the_api() -> None:
    snap = load_text(NODE.format(name="n1", zone="2024-01-01", other="2024-02-30",
                                 cidr="10.0.0.0/24"), "dump.yaml")
    labels = snap.nodes[0]["metadata"]["labels"]
    assert labels == {"topology.kubernetes.io/zone": "2024-01-01", "other": "2024-02-30"}


@pytest.mark.parametrize("value", ["!!int x", "!!bool maybe", "!!float abc", "2024-02-30"])
def test_snapshot_type_errors_are_input_errors(value: str) -> None:
    text = NODE.format(name="n1", zone="a", other=value, cidr="10.0.0.0/24")
    if value == "2024-02-30":
        assert load_text(text, "d.yaml").nodes[0]["metadata"]["labels"]["other"] == value
        return
    with pytest.raises(InputError, match="d.yaml"):
        load_text(text, "d.yaml")


@settings(max_examples=300, deadline=None)
@given(TAGGED, TAGGED, st.none() | TAGGED)
def test_cidr_yaml_with_any_tag_parses_or_fails_in_one_line(cidr: str, zone: str,
                                                            region: str | None) -> None:
    text = f"- cidr: {cidr}\n  zone: {zone}\n" + (f"  region: {region}\n" if region else "")
    try:
        out = parse_zone_cidrs(text, "zones.yaml")
    except InputError as err:
        _one_line(err, "zones.yaml")
        return
    assert all(isinstance(z.zone, str) for z in out)


def test_cidr_yaml_duplicate_field_is_refused() -> None:
    """``{cidr: ..., zone: a, zone: b}``: the second zone silently won."""
    with pytest.raises(InputError, match="zone: given twice"):
        parse_zone_cidrs("- {cidr: 10.0.0.0/8, zone: a, zone: b}\n", "zones.yaml")


@pytest.mark.parametrize("cpu", ["1e999999", "1e100000", "9223372036854776", "8E", 1e308, 10**400])
def test_cpu_beyond_int64_millis_is_a_bad_quantity(cpu: object) -> None:
    """``1e999999`` raised decimal.Overflow out of the hint model (a traceback from
    ``zonemeter explain``); ``1e100000`` built a 330,000-bit integer per node. Go's
    ``Quantity.MilliValue`` is an int64: more is no CPU count."""
    from agent.hints import cpu_millis

    with pytest.raises(InputError, match="status.allocatable.cpu"):
        cpu_millis(cpu, "Node n1")
    assert cpu_millis("9223372036854775", "Node n1") == 9223372036854775000


def test_explain_with_an_overflowing_node_cpu_is_not_a_traceback(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from agent import cli
    from tests.fixtures.topologies import two_zone_cluster, write_snapshot

    c = two_zone_cluster()
    c["nodes"][0]["status"]["allocatable"]["cpu"] = "1e999999"
    for svc in c["services"]:
        svc["metadata"]["annotations"] = {"service.kubernetes.io/topology-mode": "Auto"}
    path = write_snapshot(tmp_path / "big.json", c)
    rc = cli.main(["explain", "--snapshot", str(path)])
    out, err = capsys.readouterr()
    # the node is a malformed object of its own (exit 3), the Services are explained
    assert rc in (0, 2, 3), err
    assert rc == 2 or "status.allocatable.cpu" in out, out
    assert rc != 3 or ("malformed-object" in out and "shop/web" in out and err == ""), out
