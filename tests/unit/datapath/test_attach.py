"""agent.datapath.attach without a kernel: which devices are the node's uplinks for the
cgroup hook's coverage check (docs/datapath.md, "Interface counters")."""

from __future__ import annotations

from agent.datapath.attach import LinkFacts, select_uplinks

LO = LinkFacts(1, "lo", None, True, None)


def never() -> set[int]:
    raise AssertionError("the default routes are not needed here")


def test_physical_devices_are_the_uplinks_and_virtual_ones_are_not() -> None:
    links = [LO, LinkFacts(2, "eth0", None, False, None), LinkFacts(3, "eth1", None, False, None),
             LinkFacts(4, "cali1a2b", "veth", False, None), LinkFacts(5, "vxlan.calico", "vxlan", False, None),
             LinkFacts(6, "cilium_host", "veth", False, None), LinkFacts(7, "nodelocaldns", "dummy", False, None)]
    # AWS VPC CNI: pod traffic leaves through secondary ENIs too, so eth1 counts as well
    assert select_uplinks(links, (), never) == {2, 3}


def test_a_bond_stands_for_its_slaves_and_a_bridge_port_is_left_out() -> None:
    links = [LO, LinkFacts(2, "eno1", None, False, 4), LinkFacts(3, "eno2", None, False, 4),
             LinkFacts(4, "bond0", "bond", False, None)]
    assert select_uplinks(links, (), never) == {4}
    bridged = [LO, LinkFacts(2, "eth0", None, False, 5), LinkFacts(5, "br0", "bridge", False, None),
               LinkFacts(6, "veth1", "veth", False, 5)]
    # no device of its own on the wire: the default routes' devices (br0)
    assert select_uplinks(bridged, (), lambda: {5}) == {5}


def test_without_physical_devices_the_default_routes_decide() -> None:
    # a kind node or a lab node: its way out is a veth
    links = [LO, LinkFacts(2, "eth0", "veth", False, None), LinkFacts(3, "vethab12", "veth", False, None)]
    assert select_uplinks(links, (), lambda: {2}) == {2}
    # a default route through a device that is gone meanwhile is no uplink
    assert select_uplinks(links, (), lambda: {9}) == set()


def test_patterns_override_the_rule() -> None:
    links = [LO, LinkFacts(2, "eth0", None, False, None), LinkFacts(3, "zm12u0", "veth", False, None),
             LinkFacts(4, "zm12u1", "veth", False, None)]
    assert select_uplinks(links, ("zm12u*",), never) == {3, 4}
    assert select_uplinks(links, ("nomatch",), never) == set()
