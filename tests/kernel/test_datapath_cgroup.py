"""The cgroup_skb hook on the real kernel: attach beside other programs, hand over through
pinned links, clean up (docs/datapath.md, "The cgroup_skb hook").

Our programs go on the machine's cgroup v2 root, which every namespace of the machine
shares (lab ones too); they only count and always let packets pass. Counting is scoped to
the network namespaces of a lab node's pods (``DatapathConfig.scope_netns``), so the
host's own sockets and other tests' labs never reach the tables; the traffic is lab
traffic inside lab namespaces. The exactly-once comparison with ground truth on this
hook is tests/kernel/test_datapath.py (``flat-cgroup``).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _dp_fixtures import Flow, exchange, two_node_lab, udp_answer

from agent.datapath import Datapath, DatapathConfig, on_bpf_fs, run_in_netns, tcx
from agent.datapath import cgroup as cg
from agent.records import FlowDelta, FlowKind
from tools.lab import Lab
from tools.lab.proc import child_env, in_cgroup, node_cgroup

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = two_node_lab()
    yield lab
    lab.down()


@pytest.fixture()
def pin_dir() -> Iterator[str]:
    """A fresh pin directory on a BPF filesystem (a private bpffs when /sys/fs/bpf is
    none), removed after the test."""
    if on_bpf_fs("/sys/fs/bpf"):
        top = f"/sys/fs/bpf/zm{secrets.token_hex(2)}"
        yield f"{top}/node"
        subprocess.run(["rm", "-rf", top], check=False)
        return
    mnt = tempfile.mkdtemp(prefix="zmcg")
    subprocess.run(["mount", "-t", "bpf", "bpf", mnt], check=True)
    try:
        yield f"{mnt}/node"
    finally:
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)


def our_programs(root: str) -> dict[str, list[str]]:
    """{side: names of our programs attached to root}."""
    out: dict[str, list[str]] = {}
    for attach_type, side, _ in cg.SIDES:
        names = [tcx.prog_name(pid) for pid in cg.query(root, attach_type)]
        out[side] = [n for n in names if n.startswith("zm_cg_")]
    return out


def config(lab: Lab, node: str, **kw: object) -> DatapathConfig:
    pods = tuple(lab.pod_netns(p.name) for p in lab.topology.pods_on(node))
    return DatapathConfig(hook="cgroup", scope_netns=pods, flow_capacity=1024,
                          ephemeral_ports=(32768, 60999), **kw)  # type: ignore[arg-type]


def counted(dp: Datapath, local: str, kind: FlowKind) -> int:
    return sum(d.bytes for d in dp.drain() if str(d.local) == local and d.kind is kind)


def test_finds_the_unified_hierarchy_of_this_hybrid_machine() -> None:
    root = cg.cgroup2_root()
    assert os.path.exists(os.path.join(root, "cgroup.procs"))
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        assert any(f" {root} " in line and " - cgroup2 " in line for line in f)


def test_counts_beside_another_cgroup_program_and_detaches_only_ours(lab: Lab) -> None:
    root = cg.cgroup2_root()
    dp = Datapath(config(lab, "a"))
    other = Datapath(config(lab, "b"))  # a second multi-attached pair on the same root
    try:
        dp.attach()
        other.attach()
        assert dp.attached() == (f"cgroup:{root}",)
        assert {s: len(n) for s, n in our_programs(root).items()} == {"ingress": 2, "egress": 2}
        dp.drain()
        a1 = str(lab.pod_ip("a1", 4))
        b1 = str(lab.pod_ip("b1", 4))
        exchange(lab, Flow("a1", "b1", b1, 9100, 9100, "tcp", 4), 5000, 700)
        # a1's socket sent the request: ours counts it (the other pair is scoped to b)
        assert counted(dp, a1, FlowKind.EGRESS) >= 5000
        assert counted(other, b1, FlowKind.INGRESS) >= 5000
    finally:
        dp.close()
    assert {s: len(n) for s, n in our_programs(root).items()} == {"ingress": 1, "egress": 1}
    other.close()
    assert our_programs(root) == {"ingress": [], "egress": []}


def test_pinned_links_survive_the_agent_and_are_taken_over(lab: Lab, pin_dir: str) -> None:
    root = cg.cgroup2_root()
    pin = pin_dir
    a1 = str(lab.pod_ip("a1", 4))
    b1 = str(lab.pod_ip("b1", 4))
    try:
        first = Datapath(config(lab, "a", pin_path=pin))
        first.attach()
        first.drain()
        first.release()  # the links stay, pinned, and go on counting
        assert {"zm_cgroup_egress", "zm_cgroup_ingress"} <= set(os.listdir(pin))
        assert {s: len(n) for s, n in our_programs(root).items()} == {"ingress": 1, "egress": 1}
        exchange(lab, Flow("a1", "b1", b1, 9101, 9101, "tcp", 4), 4000, 100)
        second = Datapath(config(lab, "a", pin_path=pin))
        try:
            assert second.reused
            second.attach()
            # taken over, never a second attachment
            assert {s: len(n) for s, n in our_programs(root).items()} == {"ingress": 1, "egress": 1}
            # what the first agent's programs counted while no agent ran is drained now
            assert counted(second, a1, FlowKind.EGRESS) >= 4000
        finally:
            second.release()
    finally:
        res = Datapath.cleanup(pin)
    assert set(res.links) >= {"zm_cgroup_ingress", "zm_cgroup_egress"}
    assert our_programs(root) == {"ingress": [], "egress": []}
    assert not os.path.exists(pin)


def _sum(deltas: list[FlowDelta], local: str, remote: str, kind: FlowKind) -> tuple[int, int]:
    got = [d for d in deltas if str(d.local) == local and str(d.remote) == remote
           and d.kind is kind]
    return sum(d.bytes for d in got), sum(d.packets for d in got)


def test_socket_counters_fold_after_a_drain_and_on_close_exactly(lab: Lab) -> None:
    """A long-lived TCP connection a1 -> b1, counted at a1's egress with socket counters
    and at b1's ingress through the flow table (the same packets, offloads off): equal
    after the connection's first packet following a drain and after close; an idle socket
    holds what it counted since its last fold (the experiment's delay, docs/datapath.md)."""
    sk = Datapath(config(lab, "a", socket_counters=True))
    plain = Datapath(config(lab, "b"))
    a1, b1 = str(lab.pod_ip("a1", 4)), str(lab.pod_ip("b1", 4))
    try:
        sk.attach()
        plain.attach()
        # the cgroup programs (the uplinks' tc programs beside them: entry_hops)
        assert sorted(n for n in sk._fns if n.startswith("zm_cg_")) == [  # noqa: SLF001
            "zm_cg_egress", "zm_cg_ingress", "zm_cg_release"]
        sk.drain()
        plain.drain()
        lsn = run_in_netns(lab.pod_netns("b1"), lambda: socket.create_server((b1, 9200)))
        cli = run_in_netns(lab.pod_netns("a1"), lambda: socket.create_connection((b1, 9200)))
        srv, _ = lsn.accept()
        totals = {"sk": [0, 0], "plain": [0, 0]}

        def drain() -> None:
            for name, dp, local, remote, kind in (("sk", sk, a1, b1, FlowKind.EGRESS),
                                                  ("plain", plain, b1, a1, FlowKind.INGRESS)):
                b, n = _sum(dp.drain(), local, remote, kind)
                totals[name][0] += b
                totals[name][1] += n

        def send(size: int) -> None:
            cli.sendall(b"q" * size)
            got = 0
            while got < size:
                got += len(srv.recv(65536))

        send(20_000)
        drain()  # the socket's counts since its first packet are still in the socket
        assert totals["plain"][0] > 20_000
        assert totals["sk"][0] < totals["plain"][0]
        send(100)  # first packet after the drain: the socket's counts move to the table
        drain()
        send(5_000)
        cli.close()  # sock_release folds the rest; FIN and later go through the table
        srv.close()
        lsn.close()
        time.sleep(0.3)
        drain()
        assert totals["sk"] == totals["plain"]
    finally:
        sk.close()
        plain.close()


def _resolve(**kw: object) -> tuple[str, str]:
    """(hook, why) that Datapath would resolve for a DatapathConfig(**kw), without
    compiling anything."""
    dp = Datapath.__new__(Datapath)
    dp.config = DatapathConfig(**kw)  # type: ignore[arg-type]
    return dp._resolve_hook(), dp.hook_reason


def test_auto_takes_the_cgroup_hook_only_where_a_link_attaches_on_the_hierarchys_root(
        caplog: pytest.LogCaptureFixture) -> None:
    root = cg.cgroup2_root()
    before = {side: cg.query(root, t) for t, side, _ in cg.SIDES}
    assert cg.probe(root) is None
    assert {side: cg.query(root, t) for t, side, _ in cg.SIDES} == before  # it left nothing
    hook, why = _resolve(hook="auto")
    assert hook == "cgroup" and root in why
    assert _resolve(hook="auto", netns="zm-any")[0] == "veth"  # a lab node's datapath
    assert _resolve(hook="veth") == ("veth", "asked for")
    # a cgroup below the root (what a container sees of its own cgroup namespace): its
    # programs would count only the sockets under it
    child = os.path.join(root, f"zmtest{secrets.token_hex(3)}")
    os.mkdir(child)
    try:
        assert cg.probe(child) is None  # a link would attach: attaching is not the test
        hook, why = _resolve(hook="auto", cgroup_root=child)
        assert hook == "veth" and "not the root of the cgroup v2 hierarchy" in why, why
        with caplog.at_level("WARNING", logger="agent.datapath.attach"):
            assert _resolve(hook="cgroup", cgroup_root=child)[0] == "cgroup"  # as asked, warned
        assert any("not the root" in r.getMessage() for r in caplog.records)
    finally:
        os.rmdir(child)
    hook, why = _resolve(hook="auto", cgroup_root="/nonexistent/cgroup")
    assert hook == "veth" and "cannot read" in why
    # the host's /sys/fs/cgroup as --cgroup-root: on a hybrid host (this machine) its
    # unified/ mount is taken, on a unified one the directory itself
    top = os.path.dirname(root) if root.endswith("/unified") else root
    assert _resolve(hook="auto", cgroup_root=top) == (
        "cgroup", f"a cgroup_skb link attaches on the cgroup v2 root {root}")


def test_udp_server_port_in_the_range_is_kept_by_who_spoke_first(lab: Lab) -> None:
    """The cgroup hook keys UDP by the side that sent the first datagram
    (``zm_origins``), as the veth hook does: with no Service or endpoint written, a pod
    serving UDP on a port inside the ephemeral range keeps that port as its own beside a
    client's port outside the range, and a pod dialling such a port from a port outside
    the range keeps it as the remote one (and its own, outside the range): one key per
    side and direction for three exchanges. From ephemeral client ports, both ports lie
    in the range and neither is marked: both are kept, one key per client port
    (zm_unmarked_ephemeral; docs/datapath.md, "Late endpoints")."""
    dp = Datapath(config(lab, "a"))
    try:
        dp.attach()
        dp.drain()
        a1, b1 = str(lab.pod_ip("a1", 4)), str(lab.pod_ip("b1", 4))
        exchange(lab, Flow("b1", "a1", a1, 40000, 40000, "udp", 4, 2001), 900, 1900, count=3)
        exchange(lab, Flow("a1", "b1", b1, 40001, 40001, "udp", 4, 2002), 800, 1800, count=3)
        exchange(lab, Flow("b1", "a1", a1, 40002, 40002, "udp", 4), 700, 1700, count=3)
        deltas = [d for d in dp.drain() if d.protocol == 17 and {str(d.local), str(d.remote)}
                  == {a1, b1}]
    finally:
        dp.close()
    eph = {d.port for d in deltas if d.local_port == 40002}
    assert len(eph) == 3 and all(32768 <= p <= 60999 for p in eph), eph
    assert {(d.kind, d.port, d.local_port) for d in deltas} == {
        (FlowKind.INGRESS, 2001, 40000), (FlowKind.EGRESS, 2001, 40000),
        (FlowKind.EGRESS, 40001, 2002), (FlowKind.INGRESS, 40001, 2002),
        *((k, p, 40002) for p in eph for k in (FlowKind.INGRESS, FlowKind.EGRESS))}, deltas
    assert len(deltas) == 4 + 2 * 3


#: a UDP client run as its own process (in a pod's cgroup: its sockets belong to the
#: cgroup their creator ran in): udp_ask of argv[3] bytes to argv[1]:argv[2], argv[4] back
_CLIENT = ("import socket, sys; from _dp_fixtures import udp_ask; "
           "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); "
           "udp_ask(s, (sys.argv[1], int(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]))")


def _udp_from_cgroup(lab: Lab, client: str, app: Path, server: str, port: int,
                     req: int, resp: int) -> None:
    """One UDP exchange from a process of client's pod run in its cgroup app (as the lab
    runs its pods' processes: tools/lab/proc.py ``in_cgroup``) to server's pod, answered
    from a socket of this process in server's namespace (udp_answer)."""
    sip = str(lab.pod_ip(server, 4))
    s = run_in_netns(lab.pod_netns(server), lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    env = child_env()
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(os.path.abspath(__file__))
    try:
        s.bind((sip, port))
        s.settimeout(10)
        proc = subprocess.Popen(in_cgroup(app, [
            "ip", "netns", "exec", lab.pod_netns(client), sys.executable, "-c", _CLIENT,
            sip, str(port), str(req), str(resp)]), env=env)
        udp_answer(s, req, resp)
        assert proc.wait(timeout=10) == 0
    finally:
        s.close()


def test_keys_carry_the_pods_cgroup_so_a_reused_address_is_told_apart() -> None:
    """The cgroup hook puts the id of the parent of the socket's cgroup (a pod's cgroup,
    whose children are its containers' cgroups; the lab makes them as kubelet does:
    tools/lab/proc.py) in each key's ifindex: a pod that takes a deleted pod's address has
    a new pod cgroup, so its bytes never share an entry with the old pod's, and the newer
    pod's id is the larger one, as a new veth's ifindex is on the veth hook (attribution
    orders an address's tenures by it: docs/datapath.md, "The cgroup_skb hook"). The server
    here is a socket of this process, in the root cgroup: its keys (node b, not drained
    here) would carry 0."""
    lab = two_node_lab()  # its own lab: a1 is replaced
    try:
        old_app = lab.pod_cgroup("a1")
        assert old_app is not None and old_app.is_dir()
        old_id = os.stat(old_app.parent).st_ino  # a cgroup's inode number is its id
        b1, old_ip = str(lab.pod_ip("b1", 4)), str(lab.pod_ip("a1", 4))
        # scoped by the node's cgroup only: a9, added later, is in scope as it is made
        scope = node_cgroup(lab.prefix, "a")
        assert scope is not None
        dp = Datapath(DatapathConfig(hook="cgroup", scope_cgroup=str(scope), flow_capacity=1024,
                                     ephemeral_ports=(32768, 60999), entry_hops=False))
        assert f"-DZM_SCOPE_CGROUP={os.stat(scope).st_ino}ULL" in dp.cflags()
        assert "-DZM_SCOPE_CGROUP_LEVEL=2" in dp.cflags()  # <root>/zmlab-<prefix>/a
        try:
            dp.attach()
            dp.drain()
            _udp_from_cgroup(lab, "a1", old_app, "b1", 9100, 500, 700)
            drained = dp.drain()
            first = [d for d in drained if str(d.local) == old_ip and str(d.remote) == b1]
            # b1's answering socket is this process's (the root cgroup, node b): out of scope
            assert not [d for d in drained if str(d.local) == b1], drained
            lab.remove_pod("a1")
            assert not old_app.parent.exists()  # removed with the pod
            new = lab.add_pod({"name": "a9", "node": "a"})
            assert str(new.ip) == old_ip  # the freed address is reused
            new_app = lab.pod_cgroup("a9")
            assert new_app is not None
            new_id = os.stat(new_app.parent).st_ino
            _udp_from_cgroup(lab, "a9", new_app, "b1", 9100, 300, 400)
            second = [d for d in dp.drain() if str(d.local) == old_ip and str(d.remote) == b1]
        finally:
            dp.close()
    finally:
        lab.down()
    assert old_id < new_id
    assert {d.ifindex for d in first} == {old_id & 0xFFFFFFFF}, first
    assert {d.ifindex for d in second} == {new_id & 0xFFFFFFFF}, second
    assert sum(d.bytes for d in first) == 500 + 700 + 2 * 28
    assert sum(d.bytes for d in second) == 300 + 400 + 2 * 28


def test_pod_order_is_its_containers_not_its_cgroups_creation() -> None:
    """kubelet makes a pod's cgroup before its volumes are mounted, so a replacement that
    waited for a volume can have an older pod cgroup than its address's previous holder;
    its containers' cgroups are made after it got the address. PodCgroupOrder orders pods
    by their smallest child cgroup (real cgroup2 directories, whose inode numbers are
    their ids), so the replacement still comes after the previous holder."""
    top = os.path.join(cg.cgroup2_root(), f"zmtest-{secrets.token_hex(3)}")
    # named as kubelet's cgroupfs driver names pod cgroups (pod<uid>)
    new_pod, old_pod = (os.path.join(top, f"pod{uuid.uuid4()}") for _ in range(2))
    made: list[str] = []
    try:
        for d in (top, new_pod, old_pod, os.path.join(old_pod, "pause"),
                  os.path.join(old_pod, "app"), os.path.join(new_pod, "pause"),
                  os.path.join(new_pod, "app")):
            os.mkdir(d)
            made.append(d)
        new_id = os.stat(new_pod).st_ino & 0xFFFFFFFF
        old_id = os.stat(old_pod).st_ino & 0xFFFFFFFF
        assert new_id < old_id  # the replacement's pod cgroup is the older one
        order = cg.PodCgroupOrder(cg.cgroup2_root())
        assert order(old_id) == os.stat(os.path.join(old_pod, "pause")).st_ino & 0xFFFFFFFF
        assert order(new_id) == os.stat(os.path.join(new_pod, "pause")).st_ino & 0xFFFFFFFF
        assert order(old_id) < order(new_id)
        assert order.walks == 1  # one walk found both
        # answered once: the same key after the pod's cgroups are gone
        first = order(new_id)
        for d in reversed(made):
            os.rmdir(d)
        made.clear()
        assert order(new_id) == first
        assert order(0) == 0
        # an id that is no directory (gone before it was asked) keeps its own value
        assert order(0x7FFFFFF0) == 0x7FFFFFF0
    finally:
        for d in reversed(made):
            os.rmdir(d)
