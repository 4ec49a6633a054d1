"""The one Python mirror of ``bpf/zonemeter.h``: structs, enums and constants of the
kernel/user boundary.

Every field is declared with the same size, order and named reserved bytes as the C
side; ``tests/unit/datapath/test_abi.py`` compiles ``offsetof``/``sizeof`` of the C
structs with gcc, reads the header's ``_Static_assert`` numbers too, and checks both
against this module, so a change on one side cannot go unnoticed. :data:`FLOW_KEY_WIRE`
and :data:`FLOW_VALUE_WIRE` read the same bytes as :class:`FlowKey`/:class:`FlowValue`
with :mod:`struct`, for the drain's hot loop (:mod:`agent.datapath.drain`).

Byte order: addresses (16 bytes, IPv4 as ``::ffff:a.b.c.d``) and ports (``__be16``) are
network byte order; ``kind``, ``family``, ``proto`` are single bytes; counters are
host byte order ``u64``. Only :mod:`agent.datapath` uses these.
"""

from __future__ import annotations

import ctypes as ct
import ipaddress
import socket
import struct
import sys

from agent.records import FlowKind, IPAddress

#: ``enum zm_kind`` values of ``zm_flow_key.kind`` in order
KIND_BY_VALUE: tuple[FlowKind, ...] = (
    FlowKind.REQUEST, FlowKind.RESPONSE, FlowKind.EGRESS, FlowKind.INGRESS,
)
VALUE_BY_KIND: dict[FlowKind, int] = {k: i for i, k in enumerate(KIND_BY_VALUE)}

#: ``enum zm_family`` values of ``zm_flow_key.family``
FAMILY_INET = 4
FAMILY_INET6 = 6
#: ``ZM_OVERFLOW_SLOTS``: one overflow entry per (kind, family)
OVERFLOW_SLOTS = len(KIND_BY_VALUE) * 2
#: ``ZM_LAYOUT_VERSION``: stored in the pinned ``zm_layout`` map (see bpf/zonemeter.h)
LAYOUT_VERSION = 3
#: entries of the pinned ``zm_epoch`` marker map: pins id, then one generation per table
EPOCH_SLOTS = 3
#: ``ZM_ORIGIN_CAPACITY``: entries of the LRU ``zm_origins`` (bpf/maps.h)
ORIGIN_CAPACITY = 65536
#: ``ZM_ORIGIN_LOCAL``/``ZM_ORIGIN_REMOTE``: values of a ``zm_origins`` entry, the side
#: that sent the first packet the programs saw of a UDP/SCTP 5-tuple (bpf/classify.h zm_origin)
ORIGIN_LOCAL, ORIGIN_REMOTE = 1, 2
#: ``ZM_CACHE_SLOTS``: slots per CPU of each per-CPU flow cache
CACHE_SLOTS = 256
#: bits of a ``zm_endpoint_ports`` value: ``ZM_PORT_ENDPOINT`` (a local endpoint uses the
#: port), ``ZM_PORT_SERVICE`` (some Service in the cluster does)
PORT_ENDPOINT = 1
PORT_SERVICE = 2

_V4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"


class FlowKey(ct.Structure):
    """``struct zm_flow_key`` (48 bytes; offsets in the comments)."""

    _fields_ = [
        ("local", ct.c_uint8 * 16),     # 0: network order, IPv4 mapped
        ("remote", ct.c_uint8 * 16),    # 16: network order, IPv4 mapped
        ("port", ct.c_uint16),          # 32: __be16: network order
        ("local_port", ct.c_uint16),    # 34: __be16: the local pod's port (EGRESS/INGRESS) or 0
        ("proto", ct.c_uint8),          # 36: IP protocol number
        ("kind", ct.c_uint8),           # 37: enum zm_kind (VALUE_BY_KIND)
        ("family", ct.c_uint8),         # 38: enum zm_family (FAMILY_INET/INET6)
        ("overflow", ct.c_uint8),       # 39: 1 for an overflow entry
        ("ifindex", ct.c_uint32),       # 40: host order: the host-side veth
        ("reserved_44", ct.c_uint32),   # 44: always 0
    ]


class FlowValue(ct.Structure):
    """``struct zm_flow_value`` (16 bytes, host order)."""

    _fields_ = [
        ("bytes", ct.c_uint64),    # 0: L3 bytes on the wire
        ("packets", ct.c_uint64),  # 8: packets on the wire
    ]


class CacheSlot(ct.Structure):
    """``struct zm_cache_slot`` (64 bytes): one slot of a per-CPU flow cache, per CPU."""

    _fields_ = [
        ("key", FlowKey),             # 0: as in the flow table (byte order as FlowKey)
        ("bytes", ct.c_uint64),       # 48: host order
        ("packets", ct.c_uint64),     # 56: host order; 0 = empty slot
    ]


class EndpointKey(ct.Structure):
    """``struct zm_endpoint_key`` (20 bytes)."""

    _fields_ = [
        ("addr", ct.c_uint8 * 16),    # 0: network order, IPv4 mapped
        ("port", ct.c_uint16),        # 16: __be16: network order
        ("proto", ct.c_uint8),        # 18: IP protocol number
        ("reserved_19", ct.c_uint8),  # 19: always 0
    ]


#: ``struct zm_flow_key`` read with :mod:`struct`, big-endian: each 16-byte address as
#: two big-endian u64 (the address as an integer, high half first), the two ports in
#: host order, single bytes unaffected, the ifindex as a big-endian u32 (it is host order
#: in the key: :func:`ifindex_from_wire` turns the value read into the ifindex); ``>``
#: also means no alignment padding, so the reserved word is skipped (``4x``). Fields:
#: local hi/lo, remote hi/lo, port, local_port, proto, kind, family, overflow, ifindex.
FLOW_KEY_WIRE = struct.Struct(">QQQQHHBBBBI4x")
#: ``struct zm_flow_value`` read with :mod:`struct`: host order u64 bytes, packets
FLOW_VALUE_WIRE = struct.Struct("=QQ")
assert FLOW_KEY_WIRE.size == ct.sizeof(FlowKey) and FLOW_VALUE_WIRE.size == ct.sizeof(FlowValue)


def ifindex_from_wire(raw: int) -> int:
    """Return the ifindex of a key whose ifindex field :data:`FLOW_KEY_WIRE` read as ``raw``
    (a big-endian reading of a host-order u32: byte-swapped on little-endian hosts)."""
    if sys.byteorder == "big":
        return raw
    return int.from_bytes(raw.to_bytes(4, "big"), "little")


def addr_to_bytes(addr: IPAddress) -> bytes:
    """Return the 16-byte key form of ``addr`` (network order): IPv6 as is, IPv4 as
    ``::ffff:a.b.c.d``."""
    if isinstance(addr, ipaddress.IPv4Address):
        return _V4_MAPPED_PREFIX + addr.packed
    return addr.packed


def addr_from_bytes(raw: bytes, family: int) -> IPAddress:
    """Inverse of :func:`addr_to_bytes` for a key of ``family`` (4 or 6).

    Raises:
        ValueError: ``raw`` is not 16 bytes, or an IPv4 key is not IPv4-mapped.
    """
    if len(raw) != 16:
        raise ValueError(f"address key must be 16 bytes, got {len(raw)}")
    if family == FAMILY_INET:
        if raw[:12] != _V4_MAPPED_PREFIX:
            raise ValueError("IPv4 key is not in ::ffff:a.b.c.d form")
        return ipaddress.IPv4Address(raw[12:])
    return ipaddress.IPv6Address(raw)


def endpoint_key(addr: IPAddress, port: int, proto: int) -> EndpointKey:
    """Return the endpoint map key of ``(addr, port, proto)``; ``port`` given in host order,
    stored in network order.

    Raises:
        ValueError: port outside 1..65535 or proto outside 0..255.
    """
    if not 0 < port < 65536:
        raise ValueError(f"endpoint port {port} outside 1..65535")
    if not 0 <= proto < 256:
        raise ValueError(f"protocol {proto} outside 0..255")
    key = EndpointKey()
    ct.memmove(key.addr, addr_to_bytes(addr), 16)
    key.port = socket.htons(port)  # __be16
    key.proto = proto
    return key


def overflow_key(kind: FlowKind, family: int) -> FlowKey:
    """Return the overflow entry key of ``(kind, family)`` (addresses, port, proto zero)."""
    key = FlowKey()
    key.kind = VALUE_BY_KIND[kind]
    key.family = family
    key.overflow = 1
    return key

