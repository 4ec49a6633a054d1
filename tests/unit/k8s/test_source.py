"""agent.k8s.source: snapshot or live metadata behind one call."""

from __future__ import annotations

import ipaddress
import json

import pytest

from agent.errors import InputError
from agent.k8s.source import open_metadata
from agent.records import PeerKind
from tests.fixtures import k8s


def test_snapshot_with_zone_cidrs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = tmp_path / "lab.json"
    dump.write_text(json.dumps({"kind": "List", "items": [
        k8s.node("n1", "zone-a", internal="192.168.0.1", region="region-1", noise=True),
        k8s.pod("p", "10.0.1.5", "n1", namespace="ns", noise=True)]}))
    cidrs = tmp_path / "zones.csv"
    cidrs.write_text("172.16.0.0/12,zone-b,r\n")
    src = open_metadata(snapshot=dump, zone_cidrs=cidrs)
    assert src.watcher is None and src.origin == f"snapshot:{dump}"
    assert src.wait_synced(0)
    assert src.cache.resolve(ipaddress.ip_address("10.0.1.5")).zone == "zone-a"
    assert src.cache.resolve(ipaddress.ip_address("172.16.1.1")).kind is PeerKind.CIDR
    src.stop()


def test_bad_files_are_input_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="cannot read"):
        open_metadata(snapshot=tmp_path / "missing.json")
    bad = tmp_path / "zones.csv"
    bad.write_text("10.0.0.1/8,a\n")
    with pytest.raises(InputError, match="line 1: cidr"):
        open_metadata(snapshot=tmp_path / "missing.json", zone_cidrs=bad)
