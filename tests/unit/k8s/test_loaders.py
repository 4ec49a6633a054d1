"""Fuzz (hypothesis) the file loaders: snapshot dumps and ``--zone-cidrs`` files.

Property: any text gives either a result or an :class:`InputError` whose message is one
line and names the file; never another exception. Results are checked against what the
text says (counts of kinds, networks and zones), not just "no crash".
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import InputError
from agent.k8s.cidrs import LB_TYPES, parse_zone_cidrs
from agent.k8s.snapshot import KINDS, load_text

KEYS = ["kind", "metadata", "name", "namespace", "items", "labels", "spec", "status",
        "apiVersion", "addressType", "endpoints", "ports"]
SCALARS = (st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True)
           | st.text(max_size=6)
           | st.sampled_from(["Node", "Service", "EndpointSlice", "Pod", "List", "NodeList",
                              "ServiceList", "ConfigMap", "", "a", "shop", "10.0.0.1"]))
DOCS = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.sampled_from(KEYS), kids, max_size=5), max_leaves=30)
GOOD = st.fixed_dictionaries({
    "kind": st.sampled_from(list(KINDS) + ["ConfigMap"]),
    "metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "b-1"])},
                                      optional={"namespace": st.sampled_from(["shop", "x"])})})


def one_line(err: InputError, source: str) -> None:
    """The CLI contract: one line, naming the file."""
    text = str(err)
    assert "\n" not in text and "\r" not in text, text
    assert text.startswith(source + ": "), text


def _dump(doc: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc)
    if fmt == "yaml":
        return yaml.safe_dump(doc)
    return "---\n".join(yaml.safe_dump(d) for d in (doc if isinstance(doc, list) else [doc]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCS, st.sampled_from(["json", "yaml", "multi"]), st.booleans(), st.booleans())
def test_snapshot_any_document_loads_or_fails_in_one_line(doc: Any, fmt: str, bom: bool, crlf: bool) -> None:
    text = _dump(doc, fmt)
    if crlf:
        text = text.replace("\n", "\r\n")
    if bom:
        text = "\ufeff" + text
    try:
        snap = load_text(text, "dump.json")
    except InputError as err:
        one_line(err, "dump.json")
        return
    total = len(snap.nodes) + len(snap.services) + len(snap.endpointslices) + len(snap.pods)
    for obj in snap.nodes + snap.services + snap.endpointslices + snap.pods:
        assert isinstance(obj["metadata"]["name"], str) and obj["metadata"]["name"]
    assert total + snap.ignored >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(GOOD, max_size=8), st.sampled_from(["json", "yaml", "multi", "list", "typed"]),
       st.booleans(), st.booleans())
def test_snapshot_counts_every_good_object(objs: list[dict[str, Any]], shape: str, bom: bool,
                                           crlf: bool) -> None:
    if shape == "list":
        doc: Any = {"kind": "List", "items": objs}
    elif shape == "typed":  # NodeList-style: items without kind inherit it
        objs = [{**o, "kind": "Node"} for o in objs]
        doc = {"kind": "NodeList", "items": [{"metadata": o["metadata"]} for o in objs]}
    else:
        doc = objs
    text = _dump(doc, "json" if shape in ("list", "typed") else shape)
    if crlf:
        text = text.replace("\n", "\r\n")
    if bom:
        text = "\ufeff" + text
    snap = load_text(text, "dump")
    want = {k: sum(o["kind"] == k for o in objs) for k in KINDS}
    assert (len(snap.nodes), len(snap.services), len(snap.endpointslices), len(snap.pods)) == \
        (want["Node"], want["Service"], want["EndpointSlice"], want["Pod"])
    assert snap.ignored == sum(o["kind"] not in KINDS for o in objs)


@pytest.mark.parametrize("text", ["[" * 100_000, "- " * 20_000 + "x", '{"a":' * 50_000 + "1" + "}" * 50_000])
def test_snapshot_deep_nesting_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError) as info:
        load_text(text, "deep.json")
    one_line(info.value, "deep.json")
    assert "nested too deeply" in str(info.value)


def test_snapshot_bad_items_error_names_the_file() -> None:
    with pytest.raises(InputError) as info:
        load_text('{"kind": "List", "items": {}}', "dump.json")
    assert str(info.value) == "dump.json: document 1: items: must be a list"


@pytest.mark.parametrize("text,fld", [
    ('{"kind": "Node"}', "metadata"),
    ('{"kind": "Node", "metadata": {"name": 5}}', "metadata.name"),
    ('{"kind": "Service", "metadata": {"name": "a", "namespace": []}}', "metadata.namespace"),
    ('{"kind": 7}', "kind"),
    ("kind: List\nitems: [5]", "items[0]"),
])
def test_snapshot_errors_name_object_and_field(text: str, fld: str) -> None:
    with pytest.raises(InputError) as info:
        load_text(text, "f.yaml")
    one_line(info.value, "f.yaml")
    assert info.value.field == fld and info.value.obj


# ------------------------------------------------------------------------- zone CIDR files

NETS = st.one_of(
    st.ip_addresses(v=4).map(lambda a: ipaddress.ip_network(f"{a}/{24}", strict=False)),
    st.ip_addresses(v=6).map(lambda a: ipaddress.ip_network(f"{a}/{64}", strict=False)),
    st.sampled_from([ipaddress.ip_network(n) for n in ("10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24",
                                                        "0.0.0.0/0", "::/0", "fd00::/8")]))
ZONES = st.sampled_from(["eu-west-1a", "eu-west-1b", "us-central1-c"])
ROWS = st.lists(st.tuples(NETS, ZONES, st.none() | st.sampled_from(["eu-west-1", "r"]),
                          st.none() | st.sampled_from(LB_TYPES), st.booleans()), max_size=8)


def _unique(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    out: dict[Any, tuple[Any, ...]] = {}
    for r in rows:
        out.setdefault(r[0], r)
    return list(out.values())


@settings(max_examples=200, deadline=None)
@given(ROWS, st.sampled_from(["csv", "csv-header", "yaml", "yaml-cidrs", "json"]), st.booleans(), st.booleans())
def test_cidr_files_round_trip(rows: list[tuple[Any, ...]], fmt: str, bom: bool, crlf: bool) -> None:
    # a load balancer's range with its type, its kind written out or implied by the type
    rows = _unique(rows)
    if fmt.startswith("csv"):
        lines = (["cidr,zone,region,kind,type"] if fmt == "csv-header" else []) + [
            f"{n},{z}" + (f",{r or ''},{'load-balancer' if spelled else ''},{lb}" if lb
                          else (f",{r}" if r else "")) for n, z, r, lb, spelled in rows]
        text = "\n".join(lines) + "\n"
    else:
        items = [{"cidr": str(n), "zone": z, **({"region": r} if r else {}),
                  **({"type": lb} if lb else {}),
                  **({"kind": "load-balancer" if lb else "cidr"} if spelled else {})}
                 for n, z, r, lb, spelled in rows]
        doc: Any = {"cidrs": items} if fmt == "yaml-cidrs" else items
        text = json.dumps(doc) if fmt == "json" else yaml.safe_dump(doc)
        if not items and fmt == "yaml":
            text = ""
    if crlf:
        text = text.replace("\n", "\r\n")
    if bom:
        text = "\ufeff" + text
    got = parse_zone_cidrs(text, "zones")
    assert [(z.network, z.zone, z.region, z.lb_type) for z in got] == [r[:4] for r in rows]
    assert [z.kind for z in got] == ["load-balancer" if r[3] else "cidr" for r in rows]


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=80),
    st.lists(st.lists(st.sampled_from(["10.0.0.0/8", "10.0.0.1/8", "fd00::/300", "::1", "a", "",
                                       " ", '"', "#x", "eu-1a", "\ufeff", "1.2.3.4/33", "10.0.0.0/8"]),
                      max_size=4), max_size=5).map(lambda rows: "\r\n".join(",".join(r) for r in rows)),
    DOCS.map(lambda d: yaml.safe_dump(d)), DOCS.map(json.dumps)))
def test_cidr_any_text_parses_or_fails_in_one_line(text: str) -> None:
    try:
        got = parse_zone_cidrs(text, "zones.csv")
    except InputError as err:
        one_line(err, "zones.csv")
        return
    for z in got:
        assert z.zone and z.zone == z.zone.strip()


def test_cidr_same_network_two_zones_is_refused() -> None:
    with pytest.raises(InputError) as info:
        parse_zone_cidrs("10.0.0.0/8,a\n10.1.0.0/16,b\n10.0.0.0/8,b\n", "z.csv")
    assert str(info.value) == ("z.csv: line 3: cidr: 10.0.0.0/8 is already mapped to zone 'a' "
                               "(region None, cidr) on line 1")
    # one network as a VM range and as a load balancer's: refused too
    with pytest.raises(InputError) as info:
        parse_zone_cidrs("10.0.0.0/24,a,,load-balancer,aws-nlb\n10.0.0.0/24,a\n", "z.csv")
    assert str(info.value) == ("z.csv: line 2: cidr: 10.0.0.0/24 is already mapped to zone 'a' "
                               "(region None, load-balancer aws-nlb) on line 1")
    # the same mapping twice is harmless, and overlapping lengths are by design
    assert len(parse_zone_cidrs("10.0.0.0/8,a\n10.0.0.0/8,a\n10.0.0.0/16,b\n", "z.csv")) == 3


def test_cidr_bom_header_and_crlf() -> None:
    got = parse_zone_cidrs("\ufeffcidr,zone,region\r\n10.0.0.0/8,a,r\r\n", "z.csv")
    assert [(str(z.network), z.zone, z.region) for z in got] == [("10.0.0.0/8", "a", "r")]


@pytest.mark.parametrize("text", ["- " * 20_000 + "x", "[" * 50_000])
def test_cidr_deep_nesting_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_zone_cidrs(text, "z.yaml")
    one_line(info.value, "z.yaml")


def test_snapshot_refuses_yaml_aliases() -> None:
    # nine nested alias levels stand for 10^9 values: loading shares them, but the cache
    # serialises objects and would take minutes and gigabytes
    levels = ["x0: &a0 [y, y, y, y, y, y, y, y, y, y]"] + [
        f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = "kind: EndpointSlice\nmetadata: {name: s, namespace: x}\n" + "\n".join(levels) + "\n"
    with pytest.raises(InputError) as info:
        load_text(text, "dump.yaml")
    one_line(info.value, "dump.yaml")
    assert "aliases" in str(info.value) and "line 4 column 10" in str(info.value)  # first *a0
    # anchors alone are harmless and still load
    assert len(load_text("kind: Node\nmetadata: &m {name: n}\n", "d").nodes) == 1
