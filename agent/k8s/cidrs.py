"""Longest-prefix matching over IPv4/IPv6 networks, and the ``--zone-cidrs`` file.

The zone CIDR file maps address ranges outside the cluster (a cloud subnet belongs to one
zone) to a zone and region, so traffic to managed databases and VMs gets a zone. A range
may be marked as a load balancer's (``kind`` ``load-balancer`` with its ``type``, one of
:data:`LB_TYPES`), so its bytes form their own client class and are priced by the cloud's
rule for load-balancer traffic (docs/metadata.md, *Zone CIDR file*; docs/report.md,
*Prices by client class*). Two formats are accepted:

* CSV, one range per line: ``cidr,zone[,region[,kind[,type]]]``; a first line starting
  ``cidr,zone`` is a header; blank lines and lines starting with ``#`` are skipped.
* YAML (or JSON): a list of mappings ``{cidr: ..., zone: ..., region: ..., kind: ...,
  type: ...}``, or a mapping with such a list under ``cidrs:``.

``kind`` is ``cidr`` (the default: a VM, a managed database) or ``load-balancer``; a
``type`` without a ``kind`` means ``load-balancer``. Every error names the file, the line
and the field (``zones.csv: line 3: cidr: ...``).
"""

from __future__ import annotations

import csv
import io
import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import yaml

from agent.errors import InputError
from agent.records import IPAddress

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
V = TypeVar("V")

#: ``kind`` of a range: another peer mapped to a zone (a VM, a managed database) ...
KIND_CIDR = "cidr"
#: ... or a load balancer's addresses (the source address its targets see)
KIND_LOAD_BALANCER = "load-balancer"
KINDS: tuple[str, ...] = (KIND_CIDR, KIND_LOAD_BALANCER)
#: ``type`` of a load-balancer range, the ``lb_type`` label of its Service bytes; a fixed set
#: so a typo is an error rather than a new series, and so each has a price rule
#: (``agent.report.pricing.CLASS_RULES``). ``other``: a load balancer zonemeter has no rule
#: for (priced as ordinary inter-zone transfer).
LB_TYPES: tuple[str, ...] = ("aws-alb", "aws-nlb", "aws-clb", "gcp-lb", "azure-lb", "other")


class PrefixTable(Generic[V]):
    """Longest-prefix match table: network -> value, for IPv4 and IPv6 together.

    Lookups cost one dict probe per distinct prefix length present (typically 1 to 3),
    not one per network, so thousands of node pod CIDRs stay cheap. Not thread-safe on
    its own: :class:`agent.k8s.cache.ClusterMetadata` replaces whole tables under its lock.
    """

    __slots__ = ("_by_len",)

    def __init__(self, entries: Iterable[tuple[IPNetwork, V]] = ()) -> None:
        # (version, prefixlen) -> {network address as int: value}; lengths kept longest first
        self._by_len: dict[tuple[int, int], dict[int, V]] = {}
        for net, value in entries:
            self.add(net, value)

    def add(self, net: IPNetwork, value: V) -> None:
        """Map ``net`` to ``value`` (a later add of the same network wins)."""
        key = (net.version, net.prefixlen)
        if key not in self._by_len:
            self._by_len[key] = {}
            self._by_len = dict(sorted(self._by_len.items(), key=lambda kv: -kv[0][1]))
        self._by_len[key][int(net.network_address)] = value

    def remove(self, net: IPNetwork) -> None:
        """Forget ``net`` (no error when absent)."""
        nets = self._by_len.get((net.version, net.prefixlen))
        if nets is not None:
            nets.pop(int(net.network_address), None)
            if not nets:
                del self._by_len[(net.version, net.prefixlen)]

    def lookup(self, ip: IPAddress) -> V | None:
        """Return the value of the longest network containing ``ip``, or None."""
        version = ip.version
        bits = 32 if version == 4 else 128
        as_int = int(ip)
        for (v, plen), nets in self._by_len.items():
            if v != version:
                continue
            masked = as_int >> (bits - plen) << (bits - plen) if plen else 0
            hit = nets.get(masked)
            if hit is not None:
                return hit
        return None

    def __len__(self) -> int:
        return sum(len(n) for n in self._by_len.values())


@dataclass(frozen=True, slots=True)
class ZoneCidr:
    """One line of the zone CIDR file.

    Attributes:
        network: the address range (host bits must be zero).
        zone: the zone its addresses live in.
        region: the region, or None when not given.
        kind: :data:`KIND_CIDR` or :data:`KIND_LOAD_BALANCER`.
        lb_type: the load balancer's type (one of :data:`LB_TYPES`) for a load-balancer
            range, else None.
    """

    network: IPNetwork
    zone: str
    region: str | None
    kind: str = KIND_CIDR
    lb_type: str | None = None


def _text(value: object, source: str, where: str, name: str) -> str | None:
    """``value`` stripped, None when absent or blank; InputError when not a string."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError("not a string", source=source, obj=where, field=name)
    return value.strip() or None


def _kind(kind: object, lb_type: object, source: str, where: str) -> tuple[str, str | None]:
    """The range's ``(kind, lb_type)`` from the optional ``kind`` and ``type`` fields.

    Raises:
        InputError: an unknown kind or type, a load-balancer without a type, a type on a
            ``cidr`` range; naming the field.
    """
    k = _text(kind, source, where, "kind")
    t = _text(lb_type, source, where, "type")
    if k is not None and k.lower() not in KINDS:
        raise InputError(f"unknown kind {k!r} (expected {' or '.join(KINDS)})", source=source,
                         obj=where, field="kind")
    k = k.lower() if k is not None else (KIND_LOAD_BALANCER if t is not None else KIND_CIDR)
    if k == KIND_CIDR:
        if t is not None:
            raise InputError(f"a type ({t!r}) is only for kind {KIND_LOAD_BALANCER}",
                             source=source, obj=where, field="type")
        return k, None
    if t is None:
        raise InputError(f"missing: a {KIND_LOAD_BALANCER} range needs its type "
                         f"({', '.join(LB_TYPES)})", source=source, obj=where, field="type")
    if t.lower() not in LB_TYPES:
        raise InputError(f"unknown load balancer type {t!r} (expected one of "
                         f"{', '.join(LB_TYPES)})", source=source, obj=where, field="type")
    return k, t.lower()


def _make(cidr: object, zone: object, region: object, source: str, where: str,
          kind: object = None, lb_type: object = None) -> ZoneCidr:
    if not isinstance(cidr, str) or not cidr.strip():
        raise InputError("missing or not a string", source=source, obj=where, field="cidr")
    try:
        net = ipaddress.ip_network(cidr.strip(), strict=True)
    except ValueError as err:
        raise InputError(f"not a network: {err}", source=source, obj=where, field="cidr") from None
    if not isinstance(zone, str) or not zone.strip():
        raise InputError("missing or not a string", source=source, obj=where, field="zone")
    if region is not None and not isinstance(region, str):
        raise InputError("not a string", source=source, obj=where, field="region")
    reg = region.strip() if isinstance(region, str) and region.strip() else None
    k, t = _kind(kind, lb_type, source, where)
    return ZoneCidr(net, zone.strip(), reg, k, t)


#: the CSV columns, in order (all but the first two optional)
_CSV_FIELDS = ("cidr", "zone", "region", "kind", "type")
#: the YAML keys of one range
_YAML_FIELDS = _CSV_FIELDS


def _parse_csv(text: str, source: str) -> Iterator[tuple[str, ZoneCidr]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    lineno = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise InputError(f"not CSV: {err}", source=source, obj=f"line {reader.line_num}") from None
        lineno = reader.line_num
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if lineno == 1 and cells[0].lower() == "cidr":
            continue
        where = f"line {lineno}"
        if len(cells) < 2:
            raise InputError("missing (expected cidr,zone[,region[,kind[,type]]])", source=source,
                             obj=where, field="zone")
        if len(cells) > len(_CSV_FIELDS):
            raise InputError(f"expected at most {len(_CSV_FIELDS)} fields "
                             f"({','.join(_CSV_FIELDS)}), got {len(cells)}", source=source, obj=where)
        cells += [""] * (len(_CSV_FIELDS) - len(cells))
        yield where, _make(cells[0], cells[1], cells[2] or None, source, where,
                           cells[3] or None, cells[4] or None)


def _scalar(node: yaml.Node) -> object:
    if isinstance(node, yaml.ScalarNode):
        value = yaml.safe_load(yaml.serialize(node))
        return value
    return node  # a non-scalar: _make rejects it as "not a string"


def _parse_yaml(text: str, source: str) -> Iterator[tuple[str, ZoneCidr]]:
    try:
        root = yaml.compose(text)
    except RecursionError:
        raise InputError("invalid YAML: nested too deeply", source=source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        raise InputError(f"invalid YAML: {getattr(err, 'problem', None) or 'syntax error'}",
                         source=source, obj=where) from None
    if root is None:
        return
    if isinstance(root, yaml.MappingNode):
        for k, v in root.value:
            if isinstance(k, yaml.ScalarNode) and k.value == "cidrs":
                root = v
                break
        else:
            raise InputError("expected a list of {cidr, zone, region, kind, type} or a 'cidrs:' key",
                             source=source, obj=f"line {root.start_mark.line + 1}")
    if not isinstance(root, yaml.SequenceNode):
        raise InputError("expected a list of {cidr, zone, region, kind, type}", source=source,
                         obj=f"line {root.start_mark.line + 1}")
    for item in root.value:
        where = f"line {item.start_mark.line + 1}"
        if not isinstance(item, yaml.MappingNode):
            raise InputError("expected a mapping with cidr, zone, region, kind, type", source=source,
                             obj=where)
        fields: dict[str, object] = {}
        for k, v in item.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key not in _YAML_FIELDS:
                raise InputError(f"unknown field (expected {', '.join(_YAML_FIELDS)})", source=source,
                                 obj=f"line {k.start_mark.line + 1}", field=str(key))
            if key in fields:  # {zone: a, zone: b}: the second would silently win
                raise InputError("given twice", source=source,
                                 obj=f"line {k.start_mark.line + 1}", field=str(key))
            try:
                fields[key] = _scalar(v)
            except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError,
                    OverflowError, RecursionError) as err:
                # a tag PyYAML cannot construct safely (!!python/..., !custom) or whose text
                # is not of its type (!!float abc, !!timestamp foo)
                problem = " ".join(str(getattr(err, "problem", None) or err).split())[:120]
                raise InputError(f"unreadable value ({v.tag}): {problem}", source=source,
                                 obj=f"line {v.start_mark.line + 1}", field=str(key)) from None
        yield where, _make(fields.get("cidr"), fields.get("zone"), fields.get("region"), source, where,
                           fields.get("kind"), fields.get("type"))


def parse_zone_cidrs(text: str, source: str = "<memory>") -> tuple[ZoneCidr, ...]:
    """Parse zone CIDR text; CSV unless it looks like YAML/JSON (``-``, ``[``, ``{``, ``cidrs:``).

    Returns:
        the ranges in file order.

    Raises:
        InputError: naming ``source``, the line and the field (cidr, zone, region, kind,
            type).
    """
    text = text.removeprefix("\ufeff")  # a BOM would make the CSV header a bad cidr
    first = next((ln.strip() for ln in text.splitlines()
                  if ln.strip() and not ln.strip().startswith("#")), "")
    looks_yaml = first.startswith(("-", "[", "{", "cidrs:", "---"))
    entries = list(_parse_yaml(text, source) if looks_yaml else _parse_csv(text, source))
    # One network given twice with different zones: the lookup table keeps one value per
    # network, so the later line would silently win. Overlapping ranges of different lengths
    # are fine (the longest prefix wins, by design).
    seen: dict[IPNetwork, tuple[str, ZoneCidr]] = {}
    for where, zc in entries:
        prev = seen.setdefault(zc.network, (where, zc))
        p = prev[1]
        if (p.zone, p.region, p.kind, p.lb_type) != (zc.zone, zc.region, zc.kind, zc.lb_type):
            what = p.kind if p.lb_type is None else f"{p.kind} {p.lb_type}"
            raise InputError(f"{zc.network} is already mapped to zone {p.zone!r} "
                             f"(region {p.region!r}, {what}) on {prev[0]}", source=source,
                             obj=where, field="cidr")
    return tuple(zc for _, zc in entries)


def load_zone_cidrs(path: str | Path) -> tuple[ZoneCidr, ...]:
    """Read a ``--zone-cidrs`` file (see :func:`parse_zone_cidrs`).

    Raises:
        InputError: the file cannot be read or a line is malformed.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {getattr(err, 'strerror', None) or err}", source=str(p)) from None
    return parse_zone_cidrs(text, str(p))
