"""Restart without loss and table pressure on a real kernel.

* An agent (``python -m agent.datapath --pin-path ...``) is killed with SIGKILL while
  traffic flows; the traffic goes on while no agent runs; a second agent reuses the pinned
  maps and replaces the filters. The bytes both agents drained equal the pair ground
  truth exactly, and tc shows exactly one filter of ours per hook throughout.
* ``--cleanup`` removes the filters and the pins.
* Pins of another layout are recreated, a pin path off bpffs is refused.
* 1,000 concurrent flows through a 64-entry table: totals exact through the overflow
  entries, the stats report it, the tables keep their fixed size.

Pins go to a unique directory under /sys/fs/bpf when it is a BPF filesystem, else under
a private bpffs mounted for the test in a temporary directory; both are removed after.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.datapath import (
    PARENT_EGRESS,
    PARENT_INGRESS,
    PINNED_MAPS,
    Datapath,
    DatapathConfig,
    link_pin_name,
    map_info,
    obj_get,
    on_bpf_fs,
    run_in_netns,
)
from agent.errors import InputError
from agent.records import FlowKind
from tests.kernel._dp_fixtures import (
    PairTruth,
    datapath_config,
    ifindex,
    pod_ip,
    sh,
    tcx_chain,
    two_node_lab,
)
from tests.kernel.test_datapath_lifecycle import _filters, _ours, _udp_exchange
from tools.lab import Lab

pytestmark = pytest.mark.kernel
ROOT = Path(__file__).resolve().parents[2]
PORT = 9090



@pytest.fixture()
def pin_dir() -> Iterator[str]:
    """A fresh pin directory on a BPF filesystem, removed (or unmounted) after the test."""
    name = "zm" + secrets.token_hex(2)
    if on_bpf_fs("/sys/fs/bpf") and Path("/sys/fs/bpf").is_dir():
        path = f"/sys/fs/bpf/{name}/node"
        yield path
        Datapath.cleanup(path)
        sh("rm", "-rf", f"/sys/fs/bpf/{name}", check=False)
        return
    mnt = tempfile.mkdtemp(prefix=name)
    sh("mount", "-t", "bpf", "bpf", mnt)
    try:
        yield f"{mnt}/node"
    finally:
        sh("umount", mnt, check=False)
        os.rmdir(mnt)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """One lab for this module: each test removes the filters and pins it left (cleanup)."""
    lab = two_node_lab()
    yield lab
    lab.down()


@pytest.fixture(scope="module")
def pairs(lab: Lab) -> PairTruth:
    """Ground truth of ``lab`` for (a1, a2), IPv4."""
    pairs = PairTruth(lab)
    pairs.watch(4, "a1", "a2")
    return pairs


class Traffic:
    """UDP a1 -> a2:PORT, 400-byte datagrams every ~1 ms, each echoed back, until stop()."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.sent = 0
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(self._sink, "a2")),
                         threading.Thread(target=self._run, args=(self._send, "a1"))]

    def _run(self, fn, pod: str) -> None:  # type: ignore[no-untyped-def]
        try:
            run_in_netns(self.lab.pod_netns(pod), fn)
        except BaseException as err:  # noqa: BLE001
            self.errors.append(err)
            self._ready.set()

    def _sink(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((pod_ip(self.lab, "a2", 4), PORT))
        s.settimeout(0.1)
        self._ready.set()
        try:
            while not self._stop.is_set():
                try:
                    data, addr = s.recvfrom(2048)
                except TimeoutError:
                    continue
                s.sendto(data, addr)
        finally:
            s.close()

    def _send(self) -> None:
        self._ready.wait(5)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((pod_ip(self.lab, "a2", 4), PORT))
        s.setblocking(False)
        try:
            while not self._stop.is_set():
                try:
                    s.send(b"x" * 400)
                    self.sent += 1
                except BlockingIOError:
                    pass
                try:
                    while s.recv(2048):
                        pass
                except BlockingIOError:
                    pass
                time.sleep(0.001)
        finally:
            time.sleep(0.2)  # let the last echoes arrive before the socket goes
            s.close()

    def start(self) -> Traffic:
        for th in self._threads:
            th.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(10)
        assert not self.errors, self.errors


class Agent:
    """``python -m agent.datapath`` as a subprocess, its drained deltas collected."""

    def __init__(self, lab: Lab, pin: str, attach: str = "clsact") -> None:
        ns, uplink = lab.uplink("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.datapath", "--netns", ns, "--interval",
             "0.2", "--exclude", uplink, "--pin-path", pin, "--attach", attach],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"agent did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.start = json.loads(line)
        self.deltas: list[dict] = []

    def read_drains(self, n: int) -> None:
        """Read stdout until n more end-of-drain lines arrived."""
        assert self.proc.stdout is not None
        while n > 0:
            line = self.proc.stdout.readline()
            assert line, f"agent exited: {self.proc.stderr.read()}"  # type: ignore[union-attr]
            rec = json.loads(line)
            if "drained" in rec:
                n -= 1
            elif "kind" in rec:
                self.deltas.append(rec)

    def finish(self) -> None:
        """Read the rest of stdout after the process ended."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = json.loads(line)
            if "kind" in rec:
                self.deltas.append(rec)


def _pair_bytes(lab: Lab, deltas: list[dict]) -> int:
    pair = {pod_ip(lab, "a1", 4), pod_ip(lab, "a2", 4)}
    return sum(d["bytes"] for d in deltas if {d["local"], d["remote"]} == pair)


def _exactly_one_filter_per_hook(lab: Lab, attach: str = "clsact") -> None:
    """One attachment of ours per pod veth and side, of the kind ``attach``, none of the other."""
    ns = lab.node_netns("a")
    hosts = [lab.host_veth(p)[1] for p in ("a1", "a2")]
    chains = {(h, side): tcx_chain(ns, h, side) for h in hosts for side in ("ingress", "egress")}
    if attach == "tcx":
        assert _ours(ns) == []
        assert chains == {(h, side): [prog] for h in hosts
                          for side, prog in (("ingress", "zm_tcx_from_pod"),
                                             ("egress", "zm_tcx_to_pod"))}
        return
    assert chains == {key: [] for key in chains}
    hooks = sorted((h, parent) for h in hosts for parent in (PARENT_INGRESS, PARENT_EGRESS))
    assert sorted(_ours(ns)) == hooks
    # and no other filter besides ours (a second attachment would show up here)
    every = _filters(ns)
    assert sum(len(every[lab.host_veth(p)[1]]) for p in ("a1", "a2")) == 4


def _link_pins(lab: Lab) -> list[str]:
    return sorted(link_pin_name(ifindex(*lab.host_veth(p)), side) for p in ("a1", "a2")
                  for side in ("ingress", "egress"))


@pytest.mark.parametrize("attach", ["clsact", "tcx"])
def test_kill_9_and_restart_lose_nothing(lab: Lab, pairs: PairTruth, pin_dir: str,
                                         attach: str) -> None:
    pairs.read()
    first = Agent(lab, pin_dir, attach)
    traffic: Traffic | None = None
    second: Agent | None = None
    try:
        assert first.start["reused"] is False
        traffic = Traffic(lab).start()
        first.read_drains(3)
        # right after a drain ended: not inside one (see docs/datapath.md for that window)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        first.finish()
        before = _pair_bytes(lab, first.deltas)
        assert before > 0
        sent_at_kill = traffic.sent
        time.sleep(1.0)  # nobody drains: the kernel keeps counting into the pinned maps
        assert traffic.sent > sent_at_kill + 100
        _exactly_one_filter_per_hook(lab, attach)

        second = Agent(lab, pin_dir, attach)
        assert second.start["reused"] is True
        assert second.start["attach_mode"] == attach
        _exactly_one_filter_per_hook(lab, attach)  # replaced, not added
        second.read_drains(2)
        traffic.stop()
        traffic = None
        time.sleep(0.3)
        truth = pairs.read()
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(20) == 0
        second.finish()
    finally:
        if traffic is not None:
            traffic.stop()
        for agent in (first, second):
            if agent is not None and agent.proc.poll() is None:
                agent.proc.kill()
    after = _pair_bytes(lab, second.deltas)
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    assert expected > 0
    # every packet crosses a1's and a2's veth, both on node a
    assert before + after == 2 * expected
    assert after > 0
    # SIGTERM with pins released: filters (or links) and pins stay for the next agent
    _exactly_one_filter_per_hook(lab, attach)
    links = _link_pins(lab) if attach == "tcx" else []
    assert sorted(os.listdir(pin_dir)) == sorted([*PINNED_MAPS, *links])

    out = subprocess.run(
        [sys.executable, "-m", "agent.datapath", "--netns", lab.node_netns("a"), "--pin-path",
         pin_dir, "--cleanup"], cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    removed = json.loads(out)
    filters = sorted((lab.host_veth(p)[1], side) for p in ("a1", "a2")
                     for side in ("ingress", "egress"))
    assert sorted(map(tuple, removed["removed_filters"])) == (filters if attach == "clsact" else [])
    assert sorted(removed["removed_pins"]) == sorted(PINNED_MAPS)
    assert removed["removed_links"] == links
    assert _ours(lab.node_netns("a")) == []
    ns = lab.node_netns("a")
    assert all(tcx_chain(ns, h, side) == [] for h, side in filters)  # unpinned: detached
    assert not os.path.exists(pin_dir)


def test_stale_pins_are_recreated(pin_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64)) as dp:
        assert dp.reused is False
        dp.set_local_endpoints([("10.1.0.5", 8080, 6), ("fd00::5", 53, 17)])
        dp.release()
    ids = {}
    for name in ("zm_flows_a", "zm_lost"):
        fd = obj_get(os.path.join(pin_dir, name))
        ids[name] = map_info(fd).id
        os.close(fd)
    # same layout: reused (the same kernel maps)
    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64)) as dp:
        assert dp.reused is True
        # the endpoints the previous agent wrote are known, so a new set is a diff
        assert dp.stats().endpoints == 2
        dp.set_local_endpoints([("10.1.0.5", 8080, 6)])
        assert len(list(dp._endpoint_map.keys())) == 1
        dp.release()
    fd = obj_get(os.path.join(pin_dir, "zm_flows_a"))
    assert map_info(fd).id == ids["zm_flows_a"]
    os.close(fd)
    # another capacity: recreated with a warning naming the map
    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=128)) as dp:
        assert dp.reused is False
        dp._bpf[b"zm_layout"][dp._bpf[b"zm_layout"].Key(0)] = dp._bpf[b"zm_layout"].Leaf(999)
        dp.release()
    assert "zm_flows_a" in caplog.text and "recreating" in caplog.text
    fd = obj_get(os.path.join(pin_dir, "zm_flows_a"))
    info = map_info(fd)
    os.close(fd)
    assert info.id != ids["zm_flows_a"] and info.max_entries == 128 + 8
    # an older layout version with equal sizes: recreated too
    caplog.clear()
    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=128)) as dp:
        assert dp.reused is False
    assert "layout version 999" in caplog.text


def test_udp_origin_is_the_first_datagram_seen_and_survives_a_restart(lab: Lab,
                                                                       pin_dir: str) -> None:
    """``zm_origins`` records who sent the first datagram of a 5-tuple: a pod that is a
    UDP server on an ephemeral-range port keeps it beside its client's port outside the
    range, and the client keeps the server's port beside its own (the range rule: the
    server's is ephemeral, its own is not). The map is pinned: an agent started later
    still knows the direction of an exchange the previous one saw begin, so a reply is
    not taken for a request (which would give the server's side (2000, 0) and the
    client's (0, 2000))."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    cfg = datapath_config(lab, "a", pin_path=pin_dir)
    with Datapath(cfg) as dp:
        dp.attach()
        dp.drain()
        _udp_exchange(lab, "a1", "a2", 45000, 2000, 300, 400, 4)  # a server port in the range
        first = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2}]
    with Datapath(cfg) as dp:  # the next agent: same pins
        dp.attach()
        dp.drain()
        # a2 speaks first this time, on the same 5-tuple: still a reply to a1's request
        _udp_exchange(lab, "a2", "a1", 2000, 45000, 500, 600, 4)
        second = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2}]
    want = {(a2, FlowKind.INGRESS, 2000, 45000), (a2, FlowKind.EGRESS, 2000, 45000),
            (a1, FlowKind.EGRESS, 45000, 2000), (a1, FlowKind.INGRESS, 45000, 2000)}
    assert {(d.local, d.kind, d.port, d.local_port) for d in first} == want
    assert {(d.local, d.kind, d.port, d.local_port) for d in second} == want


def test_pins_without_a_map_added_later_are_reused_and_gain_it(pin_dir: str) -> None:
    """Pins of an agent from before the maps added to layout 3 (``ADDED_MAPS``: the entry
    maps, ``zm_origins``) are reused, counts and all, and the missing maps are created
    beside them: an upgrade recreates nothing (docs/datapath.md, "Late endpoints")."""
    from agent.datapath.pins import ADDED_MAPS

    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64)) as dp:
        dp.set_local_endpoints([("10.1.0.5", 8080, 6)])
        dp.release()
    fd = obj_get(os.path.join(pin_dir, "zm_flows_a"))
    flows_id = map_info(fd).id
    os.close(fd)
    for name in ADDED_MAPS:
        os.unlink(os.path.join(pin_dir, name))
    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64)) as dp:
        assert dp.reused is True
        assert dp.stats().endpoints == 1
        dp.release()
    assert sorted(n for n in PINNED_MAPS if os.path.exists(os.path.join(pin_dir, n))) == sorted(
        PINNED_MAPS)
    fd = obj_get(os.path.join(pin_dir, "zm_flows_a"))
    assert map_info(fd).id == flows_id
    os.close(fd)


def test_pin_path_off_bpffs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        Datapath(DatapathConfig(pin_path=str(tmp_path / "pins")))
    assert err.value.field == "pin_path" and "BPF filesystem" in str(err.value)


def test_thousand_flows_through_a_64_entry_table(lab: Lab, pairs: PairTruth) -> None:
    """More concurrent flows than the table holds: every byte is still counted, in the
    overflow entries, and the stats say so; the tables keep their fixed size."""
    capacity, flows, rounds = 64, 1000, 2
    with Datapath(datapath_config(lab, "a", flow_capacity=capacity)) as dp:
        dp.attach()
        every = dp.drain()
        pairs.read()
        v4: list = []
        for _ in range(rounds):
            def send() -> None:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                for port in range(10000, 10000 + flows):  # distinct non-ephemeral ports
                    s.sendto(b"y" * 100, (pod_ip(lab, "a2", 4), port))
                s.close()

            run_in_netns(lab.pod_netns("a1"), send)
            time.sleep(0.3)  # ICMP port unreachable replies, rate limited, counted too
            deltas = dp.drain()
            every += deltas
            v4 += [d for d in deltas if d.local.version == 4]
            stats = dp.stats().table
            assert stats.entries == capacity  # full
            assert len(deltas) <= capacity + 8
        truth = pairs.read()
        fds = dp.tables._fds
        sizes = {map_info(fd).max_entries for fd in fds}
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    assert truth[("a1", "a2", "request")][1] == rounds * flows
    keyed = sum(d.bytes for d in v4 if not d.overflow and {d.local, d.remote} == {a1, a2})
    overflow = sum(d.bytes for d in v4 if d.overflow)
    assert keyed + overflow == 2 * expected  # two veths of node a per packet
    assert overflow > 0 and keyed > 0
    assert stats.capacity == capacity
    assert stats.overflow_bytes == sum(d.bytes for d in every if d.overflow)  # v6 ND too
    assert (stats.lost_bytes, stats.lost_packets) == (0, 0)
    assert sizes == {capacity + 8}  # memory bounded by the fixed map size


def test_second_agent_waits_for_the_pins_and_gives_up(pin_dir: str) -> None:
    """A DaemonSet rollout with surge runs two agents for a moment: the new one must not
    drain (or recreate) the tables the old one still switches."""
    from agent.errors import RuntimeFailure

    first = Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64))
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeFailure, match="another agent"):
            Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64, pin_lock_seconds=0.3))
        assert time.monotonic() - t0 >= 0.3
        # nor may another layout make it recreate the pins under the running agent
        with pytest.raises(RuntimeFailure, match="another agent"):
            Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=128, pin_lock_seconds=0))
        assert first.reused is False and first.drain() == []
    finally:
        first.release()
    with Datapath(DatapathConfig(pin_path=pin_dir, flow_capacity=64, pin_lock_seconds=1)) as dp:
        assert dp.reused is True  # released: the next one takes over
