"""agent.datapath.tcx without a kernel: the ``union bpf_attr`` bytes each call hands to
bpf(2) (offsets from include/uapi/linux/bpf.h, Linux 6.6; the kernel test checks them
against the running kernel's BTF), and the link pin names of agent.datapath.attach."""

from __future__ import annotations

import ctypes
import struct

import pytest

from agent.datapath import tcx
from agent.datapath.attach import _link_pin_ifindex, link_pin_name


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bytes]]:
    """Every (cmd, attr bytes) passed to sys_bpf; each call returns 7."""
    seen: list[tuple[int, bytes]] = []

    def fake(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
        seen.append((cmd, attr.raw))
        return 7

    monkeypatch.setattr(tcx, "sys_bpf", fake)
    return seen


def test_link_create_lays_out_link_create(calls: list[tuple[int, bytes]]) -> None:
    assert tcx.link_create(5, 12, tcx.BPF_TCX_EGRESS, tcx.BPF_F_BEFORE, 0, 3) == 7
    (cmd, raw), = calls
    assert cmd == tcx.BPF_LINK_CREATE == 28
    assert struct.unpack_from("=IIII", raw, 0) == (5, 12, 47, 1 << 3)
    assert struct.unpack_from("=I", raw, 16) == (0,)   # tcx.relative_fd: no anchor
    assert struct.unpack_from("=Q", raw, 24) == (3,)   # tcx.expected_revision
    assert raw[32:] == bytes(len(raw) - 32)            # nothing else set


def test_link_update_and_detach_lay_out_their_members(calls: list[tuple[int, bytes]]) -> None:
    tcx.link_update(9, 4)
    tcx.link_detach(9)
    (c1, r1), (c2, r2) = calls
    assert (c1, struct.unpack_from("=III", r1, 0)) == (29, (9, 4, 0))  # no BPF_F_REPLACE
    assert (c2, struct.unpack_from("=I", r2, 0)) == (34, (9,))
    assert r2[4:] == bytes(len(r2) - 4)


def test_query_reads_count_and_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
        assert cmd == tcx.BPF_PROG_QUERY
        ifindex, attach_type = struct.unpack_from("=II", attr.raw, 0)
        assert (ifindex, attach_type) == (3, tcx.BPF_TCX_INGRESS)
        progs, limit = struct.unpack_from("=QI", attr.raw, 16)
        links = struct.unpack_from("=Q", attr.raw, 40)[0]
        assert limit == 64 and progs and links
        (ctypes.c_uint32 * 2).from_address(progs)[:] = [101, 102]
        (ctypes.c_uint32 * 2).from_address(links)[:] = [201, 0]
        struct.pack_into("=I", attr, 24, 2)
        struct.pack_into("=Q", attr, 56, 9)
        return 0

    monkeypatch.setattr(tcx, "sys_bpf", fake)
    assert tcx.query(3, tcx.BPF_TCX_INGRESS) == tcx.Chain((101, 102), (201, 0), 9)


def test_probe_says_no_on_einval_and_raises_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def einval(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(tcx, "sys_bpf", einval)
    assert tcx.tcx_supported() is False

    def eperm(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(tcx, "sys_bpf", eperm)
    with pytest.raises(OSError):
        tcx.tcx_supported()


@pytest.mark.parametrize("index,side", [(1, "ingress"), (4242, "egress")])
def test_link_pin_names_round_trip(index: int, side: str) -> None:
    assert _link_pin_ifindex(link_pin_name(index, side)) == index


@pytest.mark.parametrize("name", ["zm_flows_a", "zm_link_x_ingress", "zm_link_3_sideways",
                                  "zm_link__egress", "other"])
def test_other_files_are_no_link_pins(name: str) -> None:
    assert _link_pin_ifindex(name) is None
