"""The cgroup_skb hook: our programs attached as cgroup links on the node's cgroup v2 root.

A ``cgroup_skb`` program on the root of the cgroup v2 hierarchy runs for every socket of
the machine (each cgroup's effective programs include its ancestors' multi-attached
ones), whatever moves the packets between sockets: host veths, ``bpf_redirect_peer``,
netkit, socket-LB (docs/datapath.md, "The cgroup_skb hook"). The programs
(``bpf/cgroup.c``) are attached with ``BPF_LINK_CREATE`` (a cgroup link is always a
multi-attachment: ``cgroup_bpf_link_attach`` in kernel/bpf/cgroup.c passes
``BPF_F_ALLOW_MULTI``), so they sit beside any other program on the root and detach when
the last fd and pin of the link go. Pinned links survive the agent; the next agent takes
them over with ``BPF_LINK_UPDATE``, as for TCX links (:mod:`agent.datapath.tcx`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.datapath import tcx
from agent.errors import RuntimeFailure

log = logging.getLogger(__name__)

#: enum bpf_attach_type (include/uapi/linux/bpf.h)
BPF_CGROUP_INET_INGRESS = 0
BPF_CGROUP_INET_EGRESS = 1
BPF_CGROUP_INET_SOCK_RELEASE = 34
#: enum bpf_link_type: BPF_LINK_TYPE_CGROUP
BPF_LINK_TYPE_CGROUP = 3
#: (attach type, side name, program name in bpf/cgroup.c)
SIDES = ((BPF_CGROUP_INET_INGRESS, "ingress", "zm_cg_ingress"),
         (BPF_CGROUP_INET_EGRESS, "egress", "zm_cg_egress"))
#: the sock_release link of DatapathConfig.socket_counters (BPF_PROG_TYPE_CGROUP_SOCK)
RELEASE = (BPF_CGROUP_INET_SOCK_RELEASE, "release", "zm_cg_release")
#: pin file of a cgroup link of ours under pin_path: zm_cgroup_<ingress|egress>
CGROUP_PIN_PREFIX = "zm_cgroup_"


def cgroup2_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Return the mount points of every cgroup2 filesystem, in ``mountinfo`` order.

    Reads ``mountinfo`` (proc(5): field 5 the mount point, the field after ``-`` the
    filesystem type).

    Raises:
        RuntimeFailure: mountinfo is unreadable.
    """
    try:
        with open(mountinfo, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise RuntimeFailure(f"cannot read {mountinfo}: {err}") from err
    out = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and len(fields) >= 5 and right.split()[:1] == ["cgroup2"]:
            # octal escapes of the kernel's show_mountinfo (\040 for a space)
            out.append(fields[4].encode().decode("unicode_escape"))
    return out


def cgroup2_root(mountinfo: str = "/proc/self/mountinfo", under: str | None = None) -> str:
    """Return the mount point of the cgroup v2 hierarchy (``/sys/fs/cgroup`` on unified
    nodes, ``/sys/fs/cgroup/unified`` on hybrid ones).

    Args:
        mountinfo: the mount table to read (proc(5)).
        under: a directory given by the user (``--cgroup-root``): itself when it is a
            cgroup2 mount, else its ``unified`` subdirectory when that is one (the host's
            ``/sys/fs/cgroup`` of a hybrid node, mounted recursively into a container),
            else itself (a subdirectory of a cgroup2 mount: a cgroup). None: the first
            cgroup2 mount.

    Raises:
        RuntimeFailure: no cgroup2 filesystem is mounted (or mountinfo is unreadable).
    """
    mounts = cgroup2_mounts(mountinfo)
    if under is not None:
        want = os.path.normpath(under)
        for candidate in (want, os.path.join(want, "unified")):
            if candidate in mounts:
                return candidate
        return want
    if mounts:
        return mounts[0]
    raise RuntimeFailure(f"no cgroup2 filesystem in {mountinfo}: the cgroup hook needs "
                         "cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup)")


#: the inode (kernfs id) of the root directory of the cgroup v2 hierarchy: the root
#: cgroup's id is 1 (``cgroup_id()``; kernfs numbers its root 1), whatever mount shows it
ROOT_CGROUP_ID = 1


def is_hierarchy_root(path: str) -> bool:
    """Whether the cgroup v2 directory path is the root of the hierarchy (id 1), i.e. its
    programs run for every socket of the machine. A container's own ``/sys/fs/cgroup``
    under a private cgroup namespace is its cgroup, not the root (a larger id).

    Raises:
        OSError: path cannot be read.
    """
    return cgroup_id(path) == ROOT_CGROUP_ID


#: BPF_PROG_LOAD (enum bpf_cmd) and BPF_PROG_TYPE_CGROUP_SKB (enum bpf_prog_type)
BPF_PROG_LOAD = 5
BPF_PROG_TYPE_CGROUP_SKB = 8
#: ``r0 = 1; exit`` (struct bpf_insn: code, dst|src, off, imm): a cgroup_skb program
#: that lets every packet pass, as ours do
_PASS_PROGRAM = struct.pack("=BBhi", 0xB7, 0, 0, 1) + struct.pack("=BBhi", 0x95, 0, 0, 0)


def probe(root: str) -> str | None:
    """Whether a cgroup_skb link can be attached on root: load a two-instruction program
    that passes every packet, attach it as a cgroup ingress link on root, detach it.

    The program returns 1 (a cgroup_skb verdict is the AND of every program), so for the
    microseconds it is attached it changes nothing. Needs what the real attach needs
    (CAP_BPF and CAP_NET_ADMIN, cgroup BPF in the kernel, the directory).

    Returns:
        None when it could be attached, else the reason (one line).
    """
    insns = ctypes.create_string_buffer(_PASS_PROGRAM, len(_PASS_PROGRAM))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = tcx._attr()
    # prog_load: prog_type @0, insn_cnt @4, insns @8, license @16
    struct.pack_into("=IIQQ", attr, 0, BPF_PROG_TYPE_CGROUP_SKB, len(_PASS_PROGRAM) // 8,
                     ctypes.addressof(insns), ctypes.addressof(lic))
    try:
        prog = tcx.sys_bpf(BPF_PROG_LOAD, attr)
    except OSError as err:
        return f"cannot load a cgroup_skb program: {err.strerror}"
    try:
        try:
            cg = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            return f"cannot open {root}: {err.strerror}"
        try:
            link = link_create(prog, cg, BPF_CGROUP_INET_INGRESS)
        except OSError as err:
            return f"cannot attach a cgroup_skb link to {root}: {err.strerror}"
        finally:
            os.close(cg)
        try:
            tcx.link_detach(link)
        except OSError:
            pass
        os.close(link)
        return None
    finally:
        os.close(prog)


def link_create(prog_fd: int, cgroup_fd: int, attach_type: int) -> int:
    """Attach prog_fd to the cgroup behind cgroup_fd as a cgroup link; return the link fd.

    Raises:
        OSError: the kernel refused (EINVAL: wrong program type for attach_type).
    """
    attr = tcx._attr()
    # link_create: prog_fd @0, target_fd @4, attach_type @8, flags @12
    struct.pack_into("=IIII", attr, 0, prog_fd, cgroup_fd, attach_type, 0)
    return tcx.sys_bpf(tcx.BPF_LINK_CREATE, attr)


def _link_cgroup_info(fd: int) -> tuple[int, int, int]:
    """(link type, cgroup id, attach type) of link fd (``struct bpf_link_info``: type @0,
    id @4, prog_id @8, cgroup.cgroup_id @16, cgroup.attach_type @24)."""
    raw = tcx._info(fd, 32)
    ltype = struct.unpack_from("=I", raw, 0)[0]
    cgid, atype = struct.unpack_from("=QI", raw, 16)
    return ltype, cgid, atype


def cgroup_id(path: str) -> int:
    """The cgroup id of the cgroup v2 directory path (its inode number, as
    ``cgroup_id()`` in the kernel and ``name_to_handle_at`` report)."""
    return os.stat(path).st_ino


@dataclass
class CgroupLinks:
    """Our two cgroup links on one cgroup (ingress, egress), see the module docstring.

    Args:
        root: the cgroup v2 directory (:func:`cgroup2_root`).
        pin_path: directory of the pinned maps (links are pinned there too), or None.
    """

    root: str
    pin_path: str | None = None

    def __post_init__(self) -> None:
        self.fds: list[int] = []
        self._sides: tuple[tuple[int, str, str], ...] = SIDES

    def _pin(self, side: str) -> str | None:
        return os.path.join(self.pin_path, CGROUP_PIN_PREFIX + side) if self.pin_path else None

    def _take_over(self, side: str, attach_type: int) -> int | None:
        """fd of the pinned link a previous agent left on root/side, or None; a pin that
        is no live cgroup link of root and side is unlinked."""
        return tcx.take_over_pin(self._pin(side), lambda fd: _link_cgroup_info(fd) == (
            BPF_LINK_TYPE_CGROUP, cgroup_id(self.root), attach_type))

    def attach(self, prog_fds: dict[str, int]) -> None:
        """Attach (or take over and update) both links with the programs of prog_fds
        (``{program name: fd}``, the names of :data:`SIDES`). Idempotent.

        Raises:
            RuntimeFailure: the kernel refused (not root, no cgroup v2, old kernel).
        """
        if self.fds:
            return
        fds: list[int] = []
        try:
            cg = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise RuntimeFailure(f"cannot open cgroup {self.root}: {err}") from err
        sides = SIDES + ((RELEASE,) if RELEASE[2] in prog_fds else ())
        try:
            for attach_type, side, prog in sides:
                fd = self._take_over(side, attach_type)
                if fd is not None:
                    tcx.link_update(fd, prog_fds[prog])
                    log.info("took over the pinned cgroup %s link on %s", side, self.root)
                else:
                    fd = link_create(prog_fds[prog], cg, attach_type)
                    pin = self._pin(side)
                    if pin is not None:
                        tcx.obj_pin(fd, pin)
                fds.append(fd)
        except OSError as err:
            for fd in fds:
                os.close(fd)
            raise RuntimeFailure(f"cannot attach cgroup_skb programs to {self.root}: {err}") from err
        finally:
            os.close(cg)
        self.fds = fds
        self._sides = sides

    def close(self, keep: bool) -> None:
        """Close our fds; unless ``keep`` (pinned hand-over), detach the links now and
        unlink their pins. Idempotent."""
        for (_, side, _), fd in zip(self._sides, self.fds, strict=True):
            if not keep:
                detach_pinned(fd, self._pin(side))
            os.close(fd)
        self.fds = []


def detach_pinned(fd: int, pin: str | None) -> None:
    """Detach link fd now (synchronously) and unlink its pin when there is one."""
    try:
        tcx.link_detach(fd)
    except OSError as err:
        log.warning("cannot detach cgroup link: %s", err)
    if pin is not None:
        try:
            os.unlink(pin)
        except FileNotFoundError:
            pass


def cleanup_pins(pin_path: str) -> list[str]:
    """Detach and unlink the cgroup link pins under pin_path; return the pin names removed.

    Raises:
        RuntimeFailure: a pin could not be removed.
    """
    removed: list[str] = []
    for _, side, _ in (*SIDES, RELEASE):
        pin = os.path.join(pin_path, CGROUP_PIN_PREFIX + side)
        if not os.path.exists(pin):
            continue
        try:
            fd = tcx.obj_get(pin)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                tcx.link_detach(fd)
            except OSError:
                pass
            os.close(fd)
        try:
            os.unlink(pin)
        except OSError as err:
            raise RuntimeFailure(f"cannot remove link pin {pin}: {err}") from err
        removed.append(CGROUP_PIN_PREFIX + side)
    return removed


def query(root: str, attach_type: int, limit: int = 256) -> tuple[int, ...]:
    """Return the ids of the programs attached to the cgroup root itself for attach_type
    (``BPF_PROG_QUERY`` without ``BPF_F_QUERY_EFFECTIVE``), in the order they run.

    Raises:
        OSError: the kernel refused, or root cannot be opened.
    """
    progs = (ctypes.c_uint32 * limit)()
    attr = tcx._attr()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # query: target_fd @0, attach_type @4, query_flags @8, attach_flags @12,
        # prog_ids @16, prog_cnt @24
        struct.pack_into("=IIIIQI", attr, 0, fd, attach_type, 0, 0, ctypes.addressof(progs), limit)
        tcx.sys_bpf(tcx.BPF_PROG_QUERY, attr)
    finally:
        os.close(fd)
    count = struct.unpack_from("=I", attr, 24)[0]
    return tuple(progs[:count])


#: a kubelet pod cgroup's directory name: ``pod<uid>`` (cgroupfs driver) or
#: ``kubepods[-<qos>]-pod<uid with _>.slice`` (systemd driver), the uid a UUID or, for a
#: static pod, 32 hex digits (``GetPodContainerName`` and ``ConvertCgroupNameToSystemd``
#: in pkg/kubelet/cm; the pod's UID: pkg/kubelet/config for static pods)
POD_CGROUP_NAME = re.compile(
    r"(?:^|[-.])pod(?:[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$")


class PodCgroupOrder:
    """Orders the cgroup hook's pod ids (a key's ``ifindex``: the low 32 bits of the id of
    the parent of the socket's cgroup, bpf/cgroup.c ``zm_cg_hook_id``) by when the pod got
    its address rather than by when its cgroup was made.

    kubelet makes a pod's cgroup at the start of its sync, before its volumes are mounted
    and its sandbox gets an address (``SyncPod`` in pkg/kubelet/kubelet.go), so a pod
    cgroup's id can predate its address's previous holder's. Its containers' cgroups are
    made after the sandbox got the address (the runtime creates them in
    ``CreateContainer``): a pod's order key is therefore the smallest id among its cgroup's
    child cgroups, which is larger than every cgroup id of the address's previous holder
    (whose containers all ended before the address was released). A pod cgroup without
    children or no longer there when first asked keeps its own id. An id whose directory
    is not named as kubelet names pod cgroups (:data:`POD_CGROUP_NAME`) is 0: a parent
    every pod shares (kubelet ``--cgroups-per-qos=false`` puts containers under one
    slice) or a host process's, which tell no pods apart; the address is then resolved by
    time. Keys are stable: each
    id is answered once and remembered (LRU of ``capacity`` ids), so ``PodTable.veth_owner``
    sees one value per pod (docs/datapath.md, "The cgroup_skb hook").

    Args:
        root: the cgroup2 mount the hook is attached to (its directories' inode numbers
            are their cgroup ids: kernfs_ino in include/linux/kernfs.h).
        capacity: ids remembered.
        rescan_seconds: the least time between two walks of the hierarchy (a walk runs
            when an id is not in the last one), except for an id above every directory
            the last walk saw: ids are handed out in increasing order, so that cgroup was
            made after the walk and may well exist (kernfs_new_node in fs/kernfs/dir.c).
        clock: monotonic seconds.
    """

    def __init__(self, root: str, capacity: int = 65536, rescan_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from cachetools import LRUCache

        self.root = root
        self._keys: LRUCache[int, int] = LRUCache(capacity)
        self._dirs: dict[int, str] = {}
        self._rescan = rescan_seconds
        self._clock = clock
        self._walked = -float("inf")
        self._newest = 0  # the largest directory id of the last walk
        #: walks of the hierarchy so far
        self.walks = 0

    def __call__(self, pod_id: int) -> int:
        """The order key of ``pod_id`` (32 bits, host order; 0 stays 0), or 0 when its
        directory is no pod cgroup (resolve by time). Never raises: an unreadable
        directory counts as absent."""
        if not pod_id:
            return 0
        key = self._keys.get(pod_id)
        if key is not None:
            return key
        path = self._dirs.get(pod_id)
        if path is None and (pod_id > self._newest
                             or self._clock() - self._walked >= self._rescan):
            self._walk()
            path = self._dirs.get(pod_id)
        key = pod_id
        if path is not None and not POD_CGROUP_NAME.search(os.path.basename(path)):
            key = 0  # a parent shared by pods, or a host process's: resolved by time
        elif path is not None:
            try:
                # the path may name another cgroup by now (the same name made again)
                kids = [e.inode() & 0xFFFFFFFF for e in os.scandir(path)
                        if e.is_dir(follow_symlinks=False)] \
                    if os.stat(path).st_ino & 0xFFFFFFFF == pod_id else []
            except OSError:
                kids = []
            if kids:
                key = min(kids)
        self._keys[pod_id] = key
        return key

    def _walk(self) -> None:
        """Index every cgroup directory below the root by its id's low 32 bits."""
        self._walked = self._clock()
        self.walks += 1
        dirs: dict[int, str] = {}
        stack = [self.root]
        while stack:
            top = stack.pop()
            try:
                with os.scandir(top) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False):
                            dirs[e.inode() & 0xFFFFFFFF] = e.path
                            stack.append(e.path)
            except OSError:
                continue
        self._dirs = dirs
        self._newest = max(dirs, default=0)
