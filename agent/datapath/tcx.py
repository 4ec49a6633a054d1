"""TCX links through ``bpf(2)``: create, update, pin, query, inspect.

BCC 0.26 and pyroute2 have no TCX call, so this module issues the few ``bpf(2)``
commands TCX needs itself with ctypes, as :mod:`agent.datapath.pins` does for
``BPF_OBJ_GET``. Every number and every ``union bpf_attr`` offset below is from the
kernel UAPI header ``include/uapi/linux/bpf.h`` of Linux 6.6 (where TCX appeared;
``enum bpf_attach_type``, ``enum bpf_link_type``, the ``BPF_F_*`` attach flags, the
``link_create``/``link_update``/``query``/``info`` members of ``union bpf_attr``,
``struct bpf_link_info`` and ``struct bpf_prog_info``). Debian 12's linux-libc-dev
(6.1) predates TCX, so the header on this machine does not have them;
``tests/kernel/test_datapath_tcx.py`` checks the enum values against the running
kernel's BTF (``/sys/kernel/btf/vmlinux``).

Namespaces: ``BPF_LINK_CREATE`` and ``BPF_PROG_QUERY`` resolve ``target_ifindex`` in
the calling thread's network namespace (``tcx_link_attach``/``tcx_prog_query`` in
kernel/bpf/tcx.c use ``current->nsproxy->net_ns``), so callers run them through
:func:`agent.datapath.netns.run_in_netns`. Link fds, updates and pins are namespace free.

Values cross the boundary in host byte order (native ``__u32``/``__u64``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
from collections.abc import Callable
from dataclasses import dataclass

from agent.datapath.netns import run_in_netns

log = logging.getLogger(__name__)

# enum bpf_cmd
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_LINK_CREATE = 28
BPF_LINK_UPDATE = 29
BPF_LINK_GET_FD_BY_ID = 30
BPF_LINK_GET_NEXT_ID = 31
BPF_LINK_DETACH = 34
# enum bpf_attach_type
BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
# enum bpf_link_type
BPF_LINK_TYPE_TCX = 11
# generic attach flags (#define BPF_F_*)
BPF_F_REPLACE = 1 << 2
BPF_F_BEFORE = 1 << 3
BPF_F_AFTER = 1 << 4
BPF_F_ID = 1 << 5
BPF_F_LINK = 1 << 13
# enum tcx_action_base: TCX_NEXT == TC_ACT_UNSPEC, TCX_PASS == TC_ACT_OK
TCX_NEXT = -1
TCX_PASS = 0
TCX_DROP = 2
TCX_REDIRECT = 7

#: (attach type, side name): ingress of the host-side veth = packets leaving the pod
SIDES = ((BPF_TCX_INGRESS, "ingress"), (BPF_TCX_EGRESS, "egress"))

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_libc = ctypes.CDLL(None, use_errno=True)
_ATTR_SIZE = 64  # covers every member used here; the kernel zero-checks the rest


def sys_bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    """Issue ``bpf(cmd, attr, len(attr))`` and return its non-negative result.

    Args:
        cmd: ``enum bpf_cmd`` value.
        attr: a zero-filled buffer laid out as ``union bpf_attr`` (native byte order).

    Raises:
        OSError: the kernel refused (errno set), or the architecture is unknown.
    """
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:  # pragma: no cover - other architectures
        raise OSError(errno.ENOSYS, f"bpf syscall number unknown on {platform.machine()}")
    res = _libc.syscall(nr, cmd, ctypes.byref(attr), len(attr))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf cmd {cmd}: {os.strerror(err)}")
    return int(res)


def _attr() -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(_ATTR_SIZE)


def link_create(prog_fd: int, ifindex: int, attach_type: int, flags: int = BPF_F_BEFORE,
                relative: int = 0, expected_revision: int = 0) -> int:
    """Attach prog_fd to ifindex as a TCX link (``BPF_LINK_CREATE``); return the link fd.

    The link lives while an fd or a pin holds it; closing the last one detaches it.
    Call in the namespace of ifindex (module docstring).

    Args:
        prog_fd: a ``BPF_PROG_TYPE_SCHED_CLS`` program fd.
        ifindex: device index in the calling thread's network namespace.
        attach_type: :data:`BPF_TCX_INGRESS` or :data:`BPF_TCX_EGRESS`.
        flags: placement; ``BPF_F_BEFORE`` with ``relative`` 0 puts the program at the
            head of the device's list, ``BPF_F_AFTER`` with 0 at its tail.
        relative: fd (or id with ``BPF_F_ID``) of the program or link to place next to; 0: none.
        expected_revision: fail with ESTALE unless the list has this revision; 0: any.

    Raises:
        OSError: the kernel refused (EINVAL on kernels without TCX, ENODEV: no such device).
    """
    attr = _attr()
    # link_create: prog_fd @0, target_ifindex @4, attach_type @8, flags @12,
    # tcx.relative_fd @16, tcx.expected_revision @24
    struct.pack_into("=IIIIIxxxxQ", attr, 0, prog_fd, ifindex, attach_type, flags, relative,
                     expected_revision)
    return sys_bpf(BPF_LINK_CREATE, attr)


def link_update(link_fd: int, prog_fd: int) -> None:
    """Swap the program of link link_fd for prog_fd atomically (``BPF_LINK_UPDATE``).

    The link keeps its place in the device's list; no packet runs without a program.

    Raises:
        OSError: the kernel refused (ENOLINK: the link's device is gone).
    """
    attr = _attr()
    struct.pack_into("=III", attr, 0, link_fd, prog_fd, 0)  # link_fd, new_prog_fd, flags
    sys_bpf(BPF_LINK_UPDATE, attr)


def link_detach(link_fd: int) -> None:
    """Detach link link_fd from its device now (``BPF_LINK_DETACH``).

    Closing the last fd and pin also detaches, but from a deferred work item
    (``bpf_link_put`` in kernel/bpf/syscall.c), i.e. some time later; this is
    synchronous. The link object stays (defunct) until its last reference goes.

    Raises:
        OSError: the kernel refused (ENOLINK: already detached, its device is gone).
    """
    attr = _attr()
    struct.pack_into("=I", attr, 0, link_fd)
    sys_bpf(BPF_LINK_DETACH, attr)


def obj_pin(fd: int, path: str) -> None:
    """Pin the BPF object behind fd at path on a BPF filesystem (``BPF_OBJ_PIN``).

    Raises:
        OSError: the kernel refused (EEXIST: something is pinned there already).
    """
    raw = ctypes.create_string_buffer(path.encode())
    attr = _attr()
    struct.pack_into("=QI", attr, 0, ctypes.addressof(raw), fd)  # pathname, bpf_fd
    sys_bpf(BPF_OBJ_PIN, attr)


def obj_get(path: str) -> int:
    """Return a new fd of the object pinned at path (``BPF_OBJ_GET``); caller closes it.

    Raises:
        OSError: nothing pinned there, or the kernel refused.
    """
    raw = ctypes.create_string_buffer(path.encode())
    attr = _attr()
    struct.pack_into("=Q", attr, 0, ctypes.addressof(raw))
    return sys_bpf(BPF_OBJ_GET, attr)


def take_over_pin(path: str | None, is_ours: Callable[[int], bool]) -> int | None:
    """Return an fd of the link pinned at ``path`` when ``is_ours(fd)`` says it is the live
    link a previous agent left (right type, target and attach type), else None. A pin that
    is no such link (its device or cgroup is gone, its target reused) is unlinked: it counts
    nothing. ``is_ours`` may raise OSError (the link's info cannot be read: not ours).
    Used for TCX links (agent/datapath/attach.py) and cgroup links (agent/datapath/cgroup.py).
    """
    if path is None or not os.path.exists(path):
        return None
    try:
        fd = obj_get(path)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            if is_ours(fd):
                return fd
        except OSError:
            pass
        os.close(fd)
    log.info("removing stale link pin %s", path)
    os.unlink(path)
    return None


def _info(fd: int, size: int) -> bytes:
    buf = ctypes.create_string_buffer(size)
    attr = _attr()
    # info: bpf_fd @0, info_len @4, info @8
    struct.pack_into("=IIQ", attr, 0, fd, size, ctypes.addressof(buf))
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return buf.raw


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """``struct bpf_link_info`` of a link (TCX members meaningful for type 11 only).

    Attributes:
        type: ``enum bpf_link_type`` (:data:`BPF_LINK_TYPE_TCX` = 11).
        id: kernel-wide link id.
        prog_id: id of the program the link runs.
        ifindex: device index (0 once the device is gone: the link is defunct).
        attach_type: :data:`BPF_TCX_INGRESS` or :data:`BPF_TCX_EGRESS`.
    """

    type: int
    id: int
    prog_id: int
    ifindex: int
    attach_type: int


def link_info(fd: int) -> LinkInfo:
    """Return :class:`LinkInfo` of link fd (type @0, id @4, prog_id @8, tcx.ifindex @16,
    tcx.attach_type @20).

    Raises:
        OSError: fd is no BPF object, or the kernel refused.
    """
    raw = _info(fd, 64)
    typ, lid, pid = struct.unpack_from("=III", raw, 0)
    ifindex, attach_type = struct.unpack_from("=II", raw, 16)
    return LinkInfo(typ, lid, pid, ifindex, attach_type)


def prog_id(fd: int) -> int:
    """Return the kernel-wide id of program fd (``struct bpf_prog_info.id`` @4).

    Raises:
        OSError: the kernel refused.
    """
    return int(struct.unpack_from("=I", _info(fd, 96), 4)[0])


def prog_name(pid: int) -> str:
    """Return the name of program id pid (``struct bpf_prog_info.name`` @64, 16 bytes).

    Raises:
        OSError: no such program, or the kernel refused.
    """
    attr = _attr()
    struct.pack_into("=I", attr, 0, pid)
    fd = sys_bpf(BPF_PROG_GET_FD_BY_ID, attr)
    try:
        return _info(fd, 96)[64:80].split(b"\0", 1)[0].decode()
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Chain:
    """The TCX programs of one device and side, in the order they run.

    Attributes:
        prog_ids: program ids, first runs first.
        link_ids: the link id of each program (0: attached without a link).
        revision: the list's revision (changes on every attach or detach).
    """

    prog_ids: tuple[int, ...]
    link_ids: tuple[int, ...]
    revision: int


def query(ifindex: int, attach_type: int, netns: str | None = None, limit: int = 64) -> Chain:
    """Return the TCX :class:`Chain` of ifindex in netns (``BPF_PROG_QUERY``).

    Raises:
        OSError: the kernel refused (EINVAL: no TCX in this kernel; ENODEV: no device).
    """
    def run() -> Chain:
        progs = (ctypes.c_uint32 * limit)()
        links = (ctypes.c_uint32 * limit)()
        attr = _attr()
        # query: target_ifindex @0, attach_type @4, query_flags @8, attach_flags @12,
        # prog_ids @16, count @24, prog_attach_flags @32, link_ids @40,
        # link_attach_flags @48, revision @56
        struct.pack_into("=IIIIQI", attr, 0, ifindex, attach_type, 0, 0,
                         ctypes.addressof(progs), limit)
        struct.pack_into("=Q", attr, 40, ctypes.addressof(links))
        sys_bpf(BPF_PROG_QUERY, attr)
        count = struct.unpack_from("=I", attr, 24)[0]
        revision = struct.unpack_from("=Q", attr, 56)[0]
        return Chain(tuple(progs[:count]), tuple(links[:count]), int(revision))

    return run_in_netns(netns, run)


def tcx_supported(netns: str | None = None) -> bool:
    """Whether the kernel has TCX: a ``BPF_PROG_QUERY`` of ``BPF_TCX_INGRESS`` on the
    loopback device (ifindex 1 in every namespace) of netns succeeds.

    Kernels before 6.6 know no such attach type and answer EINVAL; the query changes
    nothing, needs no program and no scratch namespace.

    Raises:
        OSError: an error other than EINVAL (EPERM without CAP_BPF/CAP_NET_ADMIN).
    """
    try:
        query(1, BPF_TCX_INGRESS, netns)
    except OSError as err:
        if err.errno == errno.EINVAL:
            return False
        raise
    return True
