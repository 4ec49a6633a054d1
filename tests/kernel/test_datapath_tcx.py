"""TCX attachment on a real kernel: the bpf(2) layouts against the kernel's BTF, foreign
TCX programs on the same device (after ours, before ours, passing, redirecting), the
clsact <-> TCX switch of an agent upgrade with traffic flowing, and no link left behind.

"Foreign" programs stand for a CNI's (Cilium attaches with TCX): each counts the IPv4
UDP packets it sees in its own map and returns its verdict. Ground truth is the nft
counters of tests/kernel/_dp_fixtures.py.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.datapath import Datapath, DatapathConfig, run_in_netns, tcx
from agent.records import FlowKind
from tests.kernel._dp_fixtures import (
    Flow,
    Foreign,
    PairTruth,
    datapath_config,
    exchange,
    ifindex,
    pod_ip,
    sh,
    tcx_chain,
    two_node_lab,
)
from tests.kernel.test_datapath_lifecycle import _ours
from tests.kernel.test_datapath_restart import Traffic, pin_dir  # noqa: F401 - fixture
from tools.lab import Lab

pytestmark = pytest.mark.kernel
ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture()
def lab() -> Iterator[Lab]:
    """A lab of its own per test (foreign programs and devices are left on it)."""
    lab = two_node_lab()
    yield lab
    lab.down()


@pytest.fixture()
def pairs(lab: Lab) -> PairTruth:
    pairs = PairTruth(lab)
    pairs.watch(4, "a1", "a2")
    return pairs


def _config(lab: Lab, **kw: Any) -> DatapathConfig:
    kw.setdefault("attach", "tcx")
    return datapath_config(lab, "a", **kw)


# -- the UAPI numbers and layouts against the running kernel's BTF --------------------------

_BTF_TRAILER = {1: 4, 3: 12, 4: 12, 5: 12, 6: 8, 13: 8, 14: 4, 15: 12, 17: 4, 19: 12}
_PER_MEMBER = {4, 5, 6, 13, 15, 19}


class _Btf:
    """Enums and struct/union members of the kernel's BTF (/sys/kernel/btf/vmlinux; the
    format: Documentation/bpf/btf.rst in the kernel tree)."""

    def __init__(self, raw: bytes) -> None:
        magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("=HBBIIIII", raw)
        assert magic == 0xEB9F
        strings = hdr_len + str_off

        def name(off: int) -> str:
            return raw[strings + off:raw.index(b"\0", strings + off)].decode()

        #: per type id: (kind, name, members, size_or_type); members (name, type, value)
        #: with value the byte offset (struct/union) or the value (enum)
        self.types: list[tuple[int, str, list[tuple[str, int, int]], int]] = [(0, "", [], 0)]
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        while pos < end:
            name_off, info, target = struct.unpack_from("=III", raw, pos)
            kind, vlen, bitfield = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            pos += 12
            members: list[tuple[str, int, int]] = []
            if kind in (4, 5):
                for i in range(vlen):
                    m_name, m_type, m_off = struct.unpack_from("=III", raw, pos + 12 * i)
                    bits = m_off & 0xFFFFFF if bitfield else m_off
                    members.append((name(m_name), m_type, bits // 8))
            elif kind == 6:
                for i in range(vlen):
                    m_name, val = struct.unpack_from("=Ii", raw, pos + 8 * i)
                    members.append((name(m_name), 0, val))
            pos += _BTF_TRAILER.get(kind, 0) * (vlen if kind in _PER_MEMBER else 1)
            self.types.append((kind, name(name_off), members, target))

    def enum(self, name: str) -> dict[str, int]:
        return next({m: v for m, _, v in members} for kind, n, members, _ in self.types
                    if kind == 6 and n == name)

    def offsets(self, kind: int, name: str) -> dict[str, int]:
        """Byte offset of every named member of struct (kind 4) / union (5) name, members
        of anonymous structs and unions flattened, of named ones as ``a.b``."""
        tid = next(i for i, (k, n, _, _) in enumerate(self.types) if k == kind and n == name)
        return self._flatten(tid, "", 0)

    def _flatten(self, tid: int, prefix: str, base: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for m_name, m_type, off in self.types[tid][2]:
            sub = m_type
            while self.types[sub][0] in (8, 9, 10, 11, 18):  # typedef, qualifiers, type tag
                sub = self.types[sub][3]
            if m_name:
                out[prefix + m_name] = base + off
            if self.types[sub][0] in (4, 5):
                out.update(self._flatten(sub, prefix + (m_name + "." if m_name else ""),
                                         base + off))
        return out


def _btf() -> _Btf:
    return _Btf(Path("/sys/kernel/btf/vmlinux").read_bytes())


def test_bpf_syscall_numbers_and_layouts_match_the_running_kernel() -> None:
    btf = _btf()
    attach = btf.enum("bpf_attach_type")
    assert (attach["BPF_TCX_INGRESS"], attach["BPF_TCX_EGRESS"]) == (
        tcx.BPF_TCX_INGRESS, tcx.BPF_TCX_EGRESS)
    assert btf.enum("bpf_link_type")["BPF_LINK_TYPE_TCX"] == tcx.BPF_LINK_TYPE_TCX
    cmd = btf.enum("bpf_cmd")
    for name in ("BPF_OBJ_PIN", "BPF_OBJ_GET", "BPF_PROG_GET_FD_BY_ID", "BPF_OBJ_GET_INFO_BY_FD",
                 "BPF_PROG_QUERY", "BPF_LINK_CREATE", "BPF_LINK_UPDATE",
                 "BPF_LINK_GET_FD_BY_ID", "BPF_LINK_GET_NEXT_ID", "BPF_LINK_DETACH"):
        assert cmd[name] == getattr(tcx, name), name
    actions = btf.enum("tcx_action_base")
    assert (actions["TCX_NEXT"], actions["TCX_PASS"], actions["TCX_DROP"],
            actions["TCX_REDIRECT"]) == (tcx.TCX_NEXT, tcx.TCX_PASS, tcx.TCX_DROP,
                                         tcx.TCX_REDIRECT)
    attr = btf.offsets(5, "bpf_attr")
    assert {k: attr[k] for k in (
        "link_create.prog_fd", "link_create.target_ifindex", "link_create.attach_type",
        "link_create.flags", "link_create.tcx.relative_fd", "link_create.tcx.expected_revision",
        "link_update.link_fd", "link_update.new_prog_fd", "link_update.flags",
        "link_detach.link_fd", "query.target_ifindex", "query.attach_type", "query.prog_ids", "query.count",
        "query.link_ids", "query.revision", "info.bpf_fd", "info.info_len", "info.info",
    )} == {
        "link_create.prog_fd": 0, "link_create.target_ifindex": 4, "link_create.attach_type": 8,
        "link_create.flags": 12, "link_create.tcx.relative_fd": 16,
        "link_create.tcx.expected_revision": 24,
        "link_update.link_fd": 0, "link_update.new_prog_fd": 4, "link_update.flags": 8,
        "link_detach.link_fd": 0, "query.target_ifindex": 0, "query.attach_type": 4, "query.prog_ids": 16,
        "query.count": 24, "query.link_ids": 40, "query.revision": 56,
        "info.bpf_fd": 0, "info.info_len": 4, "info.info": 8,
    }
    link = btf.offsets(4, "bpf_link_info")
    assert (link["type"], link["id"], link["prog_id"], link["tcx.ifindex"],
            link["tcx.attach_type"]) == (0, 4, 8, 16, 20)
    prog = btf.offsets(4, "bpf_prog_info")
    assert (prog["id"], prog["name"]) == (4, 64)


def test_probe_finds_tcx_and_auto_takes_it(lab: Lab) -> None:
    assert tcx.tcx_supported(lab.node_netns("a"))
    with Datapath(datapath_config(lab, "a")) as dp:  # attach defaults to auto
        assert dp.attach_mode == "tcx" and dp.stats().attach_mode == "tcx"
        hosts = dp.attach()
        assert hosts and _ours(lab.node_netns("a")) == []
        for host in hosts:
            assert tcx_chain(lab.node_netns("a"), host, "ingress") == ["zm_tcx_from_pod"]
            assert tcx_chain(lab.node_netns("a"), host, "egress") == ["zm_tcx_to_pod"]
    for host in hosts:  # close() detached them
        assert tcx_chain(lab.node_netns("a"), host, "ingress") == []
        assert tcx_chain(lab.node_netns("a"), host, "egress") == []


# -- foreign programs on the same device ----------------------------------------------------

def _a2_counts(lab: Lab, deltas: list[Any]) -> dict[FlowKind, tuple[int, int]]:
    a1 = ipaddress.ip_address(pod_ip(lab, "a1", 4))
    a2 = ipaddress.ip_address(pod_ip(lab, "a2", 4))
    out: dict[FlowKind, tuple[int, int]] = {}
    for kind in (FlowKind.INGRESS, FlowKind.EGRESS):
        mine = [d for d in deltas if d.local == a2 and d.remote == a1 and d.kind is kind]
        out[kind] = (sum(d.bytes for d in mine), sum(d.packets for d in mine))
    return out


@pytest.mark.parametrize("placement,verdict,ours_counts", [
    ("after", tcx.TCX_PASS, True),    # ours first: ours counts, the foreign one decides
    ("before", tcx.TCX_NEXT, True),   # attached later at the head, passing on: both see all
    ("before", tcx.TCX_PASS, False),  # at the head returning TC_ACT_OK: ours is skipped
], ids=["after-ok", "before-next", "before-ok"])
def test_foreign_tcx_program_on_the_same_device(lab: Lab, pairs: PairTruth, placement: str,
                                                verdict: int, ours_counts: bool) -> None:
    ns, host = lab.host_veth("a2")
    flags = tcx.BPF_F_AFTER if placement == "after" else tcx.BPF_F_BEFORE
    with Datapath(_config(lab)) as dp:
        assert host in dp.attach()
        foreign = [Foreign(ns, host, t, flags, verdict) for t, _ in tcx.SIDES]
        try:
            for _, side in tcx.SIDES:
                ours = "zm_tcx_from_pod" if side == "ingress" else "zm_tcx_to_pod"
                order = [ours, "foreign"] if placement == "after" else ["foreign", ours]
                assert tcx_chain(ns, host, side) == order
            pairs.read()
            dp.drain()
            exchange(lab, Flow("a1", "a2", pod_ip(lab, "a2", 4), 9090, 9090, "udp", 4),
                     request_bytes=5000, response_bytes=3000, count=3)
            truth = pairs.read()
            got = _a2_counts(lab, dp.drain())
            seen = (foreign[0].seen(), foreign[1].seen())
        finally:
            for f in foreign:
                f.close()
    req, resp = truth[("a1", "a2", "request")], truth[("a1", "a2", "response")]
    assert req[1] > 0 and resp[1] > 0
    # the foreign program saw every packet: leaving a2 on ingress, entering a2 on egress
    assert seen == (resp[1], req[1])
    if ours_counts:
        assert got[FlowKind.INGRESS] == req and got[FlowKind.EGRESS] == resp
    else:
        # what a data plane in front of us that ends the list does: we see nothing, while
        # the interface carried every packet (the coverage alarm's case)
        assert got[FlowKind.INGRESS] == (0, 0) and got[FlowKind.EGRESS] == (0, 0)


def test_redirecting_foreign_program_after_ours(lab: Lab) -> None:
    """A program after ours on a1's veth redirects a1's UDP packets to another device (a
    veth pair inside the node, no dummy driver here): ours counted each, the device
    transmitted each (its tx_packets), none reached a2."""
    ns, host = lab.host_veth("a1")
    sh("ip", "-n", ns, "link", "add", "zmredir0", "type", "veth", "peer", "name", "zmredir1")
    sh("ip", "-n", ns, "link", "set", "zmredir0", "up")
    sh("ip", "-n", ns, "link", "set", "zmredir1", "up")
    target = ifindex(ns, "zmredir0")

    def tx_packets() -> int:
        stats = json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", "zmredir0"))
        return int(stats[0]["stats64"]["tx"]["packets"])

    n, size = 50, 500
    a1 = ipaddress.ip_address(pod_ip(lab, "a1", 4))
    a2 = ipaddress.ip_address(pod_ip(lab, "a2", 4))

    def send() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for _ in range(n):
                s.sendto(b"x" * size, (str(a2), 9091))
        finally:
            s.close()

    with Datapath(_config(lab)) as dp:
        assert host in dp.attach()
        foreign = Foreign(ns, host, tcx.BPF_TCX_INGRESS, tcx.BPF_F_AFTER, redirect=target)
        try:
            assert tcx_chain(ns, host, "ingress") == ["zm_tcx_from_pod", "foreign"]
            dp.drain()
            before = tx_packets()
            run_in_netns(lab.pod_netns("a1"), send)
            time.sleep(0.3)
            deltas = dp.drain()
            redirected = tx_packets() - before
            seen = foreign.seen()
        finally:
            foreign.close()
    out = [d for d in deltas if d.local == a1 and d.remote == a2 and d.kind is FlowKind.EGRESS]
    assert (sum(d.bytes for d in out), sum(d.packets for d in out)) == (n * (size + 28), n)
    assert seen == n
    assert redirected == n
    # redirected away: nothing of it reached a2's veth
    assert not [d for d in deltas if d.local == a2 and d.remote == a1]


# -- switching between clsact and TCX, restarts ---------------------------------------------

def _pair_bytes(lab: Lab, deltas: list[Any]) -> int:
    pair = {ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2")}
    return sum(d.bytes for d in deltas if {d.local, d.remote} == pair)


def test_switching_clsact_to_tcx_and_back_counts_every_packet_once(
        lab: Lab, pairs: PairTruth, pin_dir: str) -> None:  # noqa: F811 - fixture
    """Three agents with the same pins, UDP flowing all along: clsact, then tcx (the
    upgrade), then clsact again. Each switch leaves one attachment of ours per hook and
    the three agents' bytes equal the ground truth exactly (counted once, none lost)."""
    ns = lab.node_netns("a")
    hosts = [lab.host_veth(p)[1] for p in ("a1", "a2")]
    drained: list[Any] = []
    traffic: Traffic | None = None
    try:
        for attach in ("clsact", "tcx", "clsact"):
            dp = Datapath(_config(lab, attach=attach, pin_path=pin_dir))
            try:
                dp.attach()
                if traffic is None:  # from the first attachment on: every packet counted
                    pairs.read()
                    traffic = Traffic(lab).start()
                chains = {(h, side): tcx_chain(ns, h, side) for h in hosts
                          for _, side in tcx.SIDES}
                if attach == "tcx":
                    assert _ours(ns) == []
                    assert all(len(c) == 1 for c in chains.values()), chains
                else:
                    assert len(_ours(ns)) == 4
                    assert all(c == [] for c in chains.values()), chains
                time.sleep(0.5)
                drained += dp.drain()
            finally:
                dp.release()
            time.sleep(0.3)  # nobody drains: the kernel keeps counting into the pins
    finally:
        if traffic is not None:
            traffic.stop()
    time.sleep(0.3)
    truth = pairs.read()
    with Datapath(_config(lab, attach="clsact", pin_path=pin_dir)) as last:
        last.attach()  # takes the filters over, so that close() removes them
        drained += last.drain()
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    assert expected > 100 * 428
    assert _pair_bytes(lab, drained) == 2 * expected  # a1's and a2's veth, once each
    assert _ours(ns) == []


def test_kill_9_without_pins_leaves_no_link(lab: Lab) -> None:
    """Without pins the agent's fds are a link's only references: the kernel detaches
    the links when the process dies, even by SIGKILL."""
    ns, uplink = lab.uplink("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.datapath", "--netns", ns, "--interval", "0.5",
         "--exclude", uplink, "--attach", "tcx"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        start = json.loads(proc.stdout.readline())
        assert start["attach_mode"] == "tcx"
        hosts = start["attached"]
        assert sorted(hosts) == sorted(lab.host_veth(p)[1] for p in ("a1", "a2"))
        assert all(tcx_chain(ns, h, "ingress") == ["zm_tcx_from_pod"] for h in hosts)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.2)  # link release runs from a deferred work item after the fd closes
    assert all(tcx_chain(ns, h, side) == [] for h in hosts for side in ("ingress", "egress"))


def test_pinned_link_of_a_deleted_device_is_dropped(lab: Lab, pin_dir: str) -> None:  # noqa: F811
    """A pod deleted while no agent ran leaves a pinned link whose device is gone; the
    next agent unlinks its pins (it counts nothing) and keeps the others."""
    index = ifindex(*lab.host_veth("a2"))
    dp = Datapath(_config(lab, pin_path=pin_dir))
    dp.attach()
    dp.release()
    assert f"zm_link_{index}_ingress" in os.listdir(pin_dir)
    lab.remove_pod("a2")
    with Datapath(_config(lab, pin_path=pin_dir)) as dp2:
        assert dp2.reused
        assert dp2.attach() == (lab.host_veth("a1")[1],)
        pins = os.listdir(pin_dir)
        assert not [p for p in pins if p.startswith(f"zm_link_{index}_")]
        a1 = ifindex(*lab.host_veth("a1"))
        assert {f"zm_link_{a1}_ingress", f"zm_link_{a1}_egress"} <= set(pins)
    res = Datapath.cleanup(pin_dir, lab.node_netns("a"))
    assert res.links == ()  # close() without keep_attached already removed them


# -- interface counters against counted bytes -----------------------------------------------

def test_interface_bytes_match_counted_bytes_until_a_program_before_ours_ends_the_list(
        lab: Lab) -> None:
    """a2's host veth: what the device's own counters carried (less 14 Ethernet bytes per
    frame) equals what ours counted on it, up to a few non-IP frames (ARP); with a
    foreign program in front of ours returning TC_ACT_OK the interface still carries
    it all and ours counts nothing: the gap the coverage alarm reports."""
    ns, host = lab.host_veth("a2")
    index = ifindex(ns, host)
    a2 = {ipaddress.ip_address(pod_ip(lab, "a2", f)) for f in (4, 6)}
    flow = Flow("a1", "a2", pod_ip(lab, "a2", 4), 9090, 9090, "udp", 4)

    def interval(dp: Datapath) -> tuple[tuple[int, int], tuple[int, int]]:
        """((counted L3 into a2, interface L3 into a2), (counted, interface) out of a2)."""
        dp.drain()
        exchange(lab, flow, request_bytes=40000, response_bytes=20000, count=2)
        deltas = dp.drain()
        got = dp.interface_bytes()[index]
        assert got.name == host
        into = sum(d.bytes for d in deltas if d.local in a2
                   and d.kind in (FlowKind.INGRESS, FlowKind.REQUEST))
        out = sum(d.bytes for d in deltas if d.local in a2
                  and d.kind in (FlowKind.EGRESS, FlowKind.RESPONSE))
        return ((into, got.tx_bytes - 14 * got.tx_packets),
                (out, got.rx_bytes - 14 * got.rx_packets))

    with Datapath(_config(lab)) as dp:
        dp.attach()
        dp.drain()
        assert dp.interface_bytes() == {}  # no interval yet
        for counted, carried in interval(dp):
            assert counted > 20000
            assert 0 <= carried - counted <= 10 * 28  # at most a few ARP frames (28 L3 bytes)
        foreign = [Foreign(ns, host, t, tcx.BPF_F_BEFORE, tcx.TCX_PASS) for t, _ in tcx.SIDES]
        try:
            for counted, carried in interval(dp):
                assert counted == 0
                assert carried > 20000
        finally:
            for f in foreign:
                f.close()
