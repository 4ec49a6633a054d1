"""The ctypes mirror in agent/datapath/abi.py matches bpf/zonemeter.h field by field.

The C side is measured, not assumed: a tiny C program including the real header is
built with gcc and prints sizeof/offsetof of every field; the test compares them with
the ctypes structures. The header's own ``_Static_assert`` numbers are read too: they
must name every mirrored field and agree with both. Also checks the :mod:`struct`
readers of the same bytes and the key encoders (byte order, IPv4 mapping).
"""

from __future__ import annotations

import ctypes as ct
import ipaddress
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from agent.datapath import abi as bt
from agent.records import FlowKind

BPF_DIR = Path(__file__).resolve().parents[3] / "bpf"

STRUCTS = {
    "zm_flow_key": bt.FlowKey,
    "zm_flow_value": bt.FlowValue,
    "zm_endpoint_key": bt.EndpointKey,
    "zm_cache_slot": bt.CacheSlot,
}


def _c_layout(tmp_path: Path) -> dict[str, int]:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "zonemeter.h"',
             "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof(struct {cname}));')
        for fname, _ in cls._fields_:
            lines.append(f'printf("{cname}.{fname} %zu\\n", offsetof(struct {cname}, {fname}));')
    for macro in ("ZM_KIND_REQUEST", "ZM_KIND_RESPONSE", "ZM_KIND_EGRESS", "ZM_KIND_INGRESS",
                  "ZM_FAMILY_INET", "ZM_FAMILY_INET6", "ZM_OVERFLOW_SLOTS",
                  "ZM_LAYOUT_VERSION", "ZM_CACHE_SLOTS", "ZM_PORT_ENDPOINT", "ZM_PORT_SERVICE",
                  "ZM_ORIGIN_CAPACITY", "ZM_ORIGIN_LOCAL", "ZM_ORIGIN_REMOTE"):
        lines.append(f'printf("{macro} %d\\n", (int){macro});')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{BPF_DIR}", "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to measure the C struct layout (apt-get install gcc)")
    return _c_layout(tmp_path_factory.mktemp("layout"))


@pytest.mark.parametrize("cname", sorted(STRUCTS))
def test_sizes_and_offsets_match_c(c_layout: dict[str, int], cname: str) -> None:
    cls = STRUCTS[cname]
    assert ct.sizeof(cls) == c_layout[cname]
    for fname, _ in cls._fields_:
        assert getattr(cls, fname).offset == c_layout[f"{cname}.{fname}"], fname


def test_constants_match_c(c_layout: dict[str, int]) -> None:
    for kind, name in ((FlowKind.REQUEST, "ZM_KIND_REQUEST"), (FlowKind.RESPONSE, "ZM_KIND_RESPONSE"),
                       (FlowKind.EGRESS, "ZM_KIND_EGRESS"), (FlowKind.INGRESS, "ZM_KIND_INGRESS")):
        assert bt.VALUE_BY_KIND[kind] == c_layout[name]
    assert bt.FAMILY_INET == c_layout["ZM_FAMILY_INET"]
    assert bt.FAMILY_INET6 == c_layout["ZM_FAMILY_INET6"]
    assert bt.OVERFLOW_SLOTS == c_layout["ZM_OVERFLOW_SLOTS"]
    assert bt.LAYOUT_VERSION == c_layout["ZM_LAYOUT_VERSION"]
    assert bt.CACHE_SLOTS == c_layout["ZM_CACHE_SLOTS"]
    assert bt.PORT_ENDPOINT == c_layout["ZM_PORT_ENDPOINT"]
    assert bt.PORT_SERVICE == c_layout["ZM_PORT_SERVICE"]
    assert bt.ORIGIN_CAPACITY == c_layout["ZM_ORIGIN_CAPACITY"]
    assert (bt.ORIGIN_LOCAL, bt.ORIGIN_REMOTE) == (c_layout["ZM_ORIGIN_LOCAL"],
                                                   c_layout["ZM_ORIGIN_REMOTE"])


def test_endpoint_key_is_network_order_and_v4_mapped() -> None:
    key = bt.endpoint_key(ipaddress.ip_address("10.1.2.3"), 8080, 6)
    raw = bytes(key)
    assert raw[:16] == bytes(10) + b"\xff\xff" + bytes([10, 1, 2, 3])
    assert raw[16:18] == (8080).to_bytes(2, "big")
    assert raw[18] == 6 and raw[19] == 0


def test_address_round_trip() -> None:
    for text, fam in (("192.0.2.7", 4), ("2001:db8::7", 6), ("::ffff:1.2.3.4", 6)):
        ip = ipaddress.ip_address(text)
        assert bt.addr_from_bytes(bt.addr_to_bytes(ip), fam) == ip
    with pytest.raises(ValueError):
        bt.addr_from_bytes(ipaddress.ip_address("2001:db8::7").packed, 4)


def test_endpoint_key_rejects_bad_port() -> None:
    with pytest.raises(ValueError):
        bt.endpoint_key(ipaddress.ip_address("10.0.0.1"), 0, 6)
    with pytest.raises(ValueError):
        bt.endpoint_key(ipaddress.ip_address("10.0.0.1"), 65536, 6)


def test_overflow_key_has_only_kind_family_flag() -> None:
    key = bt.overflow_key(FlowKind.EGRESS, 6)
    raw = bytes(key)
    assert raw[:37] == bytes(37)
    assert raw[37:40] == bytes([2, 6, 1]) and raw[40:] == bytes(8)


def _static_asserts() -> tuple[dict[str, int], dict[str, int]]:
    """(sizes, offsets) stated by ZM_ASSERT_SIZE/ZM_ASSERT_OFFSET in bpf/zonemeter.h."""
    text = (BPF_DIR / "zonemeter.h").read_text()
    sizes = {m[0]: int(m[1]) for m in re.findall(r"^ZM_ASSERT_SIZE\((\w+), (\d+)\);", text, re.M)}
    offsets = {f"{m[0]}.{m[1]}": int(m[2])
               for m in re.findall(r"^ZM_ASSERT_OFFSET\((\w+), (\w+), (\d+)\);", text, re.M)}
    return sizes, offsets


def test_static_asserts_cover_every_mirrored_field(c_layout: dict[str, int]) -> None:
    sizes, offsets = _static_asserts()
    assert sorted(sizes) == sorted(STRUCTS)
    for cname, cls in STRUCTS.items():
        assert sizes[cname] == ct.sizeof(cls) == c_layout[cname], cname
        for fname, _ in cls._fields_:
            key = f"{cname}.{fname}"
            assert offsets[key] == getattr(cls, fname).offset == c_layout[key], key
    assert len(offsets) == sum(len(cls._fields_) for cls in STRUCTS.values())


def test_static_assert_fails_the_build_when_a_field_moves(tmp_path: Path) -> None:
    """The assertions are live: a header whose key gains a byte before ``port`` does not compile."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to compile bpf/zonemeter.h (apt-get install gcc)")
    text = (BPF_DIR / "zonemeter.h").read_text()
    moved = text.replace("\t__be16 port;        /* 32:", "\t__u8 extra;\n\t__be16 port;        /* 32:", 1)
    assert moved != text
    (tmp_path / "zonemeter.h").write_text(moved)
    (tmp_path / "t.c").write_text('#include "zonemeter.h"\nint main(void) { return 0; }\n')
    res = subprocess.run(["gcc", "-fsyntax-only", f"-I{tmp_path}", str(tmp_path / "t.c")],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "offsetof(struct zm_flow_key, port) != 32" in res.stderr


def test_struct_readers_read_what_ctypes_writes() -> None:
    key = bt.FlowKey()
    ct.memmove(key.local, bt.addr_to_bytes(ipaddress.ip_address("10.1.2.3")), 16)
    ct.memmove(key.remote, bt.addr_to_bytes(ipaddress.ip_address("2001:db8::9")), 16)
    key.port, key.proto, key.kind, key.family = socket.htons(8080), 6, 3, 4
    key.overflow, key.local_port, key.ifindex = 0, socket.htons(50051), 0x01020304
    lhi, llo, rhi, rlo, port, local_port, proto, kind, family, overflow, ifindex = (
        bt.FLOW_KEY_WIRE.unpack(bytes(key)))
    assert (lhi << 64 | llo) == int(ipaddress.ip_address("::ffff:10.1.2.3"))
    assert (rhi << 64 | rlo) == int(ipaddress.ip_address("2001:db8::9"))
    assert (port, local_port, proto, kind, family, overflow) == (8080, 50051, 6, 3, 4, 0)
    assert bt.ifindex_from_wire(ifindex) == 0x01020304
    value = bt.FlowValue(bytes=2**40 + 7, packets=3)
    assert bt.FLOW_VALUE_WIRE.unpack(bytes(value)) == (2**40 + 7, 3)
