"""Longest-prefix matching over IPv4/IPv6 networks, and the ``--zone-cidrs`` file.

The zone CIDR file maps address ranges outside the cluster (a cloud subnet belongs to one
zone) to a zone and region, so traffic to managed databases and VMs gets a zone. Two
formats are accepted:

* CSV, one range per line: ``cidr,zone[,region]``; a first line ``cidr,zone,region`` is a
  header; blank lines and lines starting with ``#`` are skipped.
* YAML (or JSON): a list of mappings ``{cidr: ..., zone: ..., region: ...}``, or a mapping
  with such a list under ``cidrs:``.

Every error names the file, the line and the field (``zones.csv: line 3: cidr: ...``).
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
    """

    network: IPNetwork
    zone: str
    region: str | None


def _make(cidr: object, zone: object, region: object, source: str, where: str) -> ZoneCidr:
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
    return ZoneCidr(net, zone.strip(), reg)


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
            raise InputError("missing (expected cidr,zone[,region])", source=source, obj=where,
                             field="zone")
        if len(cells) > 3:
            raise InputError(f"expected at most 3 fields, got {len(cells)}", source=source, obj=where)
        yield where, _make(cells[0], cells[1], cells[2] if len(cells) == 3 else None, source, where)


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
            raise InputError("expected a list of {cidr, zone, region} or a 'cidrs:' key",
                             source=source, obj=f"line {root.start_mark.line + 1}")
    if not isinstance(root, yaml.SequenceNode):
        raise InputError("expected a list of {cidr, zone, region}", source=source,
                         obj=f"line {root.start_mark.line + 1}")
    for item in root.value:
        where = f"line {item.start_mark.line + 1}"
        if not isinstance(item, yaml.MappingNode):
            raise InputError("expected a mapping with cidr, zone, region", source=source, obj=where)
        fields: dict[str, object] = {}
        for k, v in item.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key not in ("cidr", "zone", "region"):
                raise InputError("unknown field (expected cidr, zone, region)", source=source,
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
        yield where, _make(fields.get("cidr"), fields.get("zone"), fields.get("region"), source, where)


def parse_zone_cidrs(text: str, source: str = "<memory>") -> tuple[ZoneCidr, ...]:
    """Parse zone CIDR text; CSV unless it looks like YAML/JSON (``-``, ``[``, ``{``, ``cidrs:``).

    Returns:
        the ranges in file order.

    Raises:
        InputError: naming ``source``, the line and the field (cidr, zone, region).
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
        if (prev[1].zone, prev[1].region) != (zc.zone, zc.region):
            raise InputError(f"{zc.network} is already mapped to zone {prev[1].zone!r} "
                             f"(region {prev[1].region!r}) on {prev[0]}", source=source,
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
