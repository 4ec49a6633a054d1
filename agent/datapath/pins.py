"""BPF object syscalls and the pinned maps: find, check, lock, recreate.

With ``DatapathConfig.pin_path`` every map of ``bpf/maps.h`` is pinned on a BPF
filesystem under its own name (BCC's ``BPF_TABLE_PINNED``). Before BCC loads the
programs, :func:`prepare_pins` decides whether the pins left by a previous agent fit this
agent's layout (``ZM_LAYOUT_VERSION``, struct sizes, capacities) and are reused, or are
unlinked so BCC creates fresh ones; :func:`lock_pins` keeps two agents from sharing them
(docs/datapath.md, "Restart without loss").
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import platform
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from agent.datapath.abi import (
    CACHE_SLOTS,
    EPOCH_SLOTS,
    LAYOUT_VERSION,
    ORIGIN_CAPACITY,
    OVERFLOW_SLOTS,
    CacheSlot,
    EndpointKey,
    FlowKey,
    FlowValue,
)
from agent.datapath.config import DatapathConfig
from agent.errors import InputError, RuntimeFailure

log = logging.getLogger(__name__)

#: statfs(2) f_type of a BPF filesystem (BPF_FS_MAGIC, include/uapi/linux/magic.h)
BPF_FS_MAGIC = 0xCAFE4A11
_MAP_HASH, _MAP_ARRAY, _MAP_PERCPU_ARRAY, _MAP_LRU_HASH, _MAP_ARRAY_OF_MAPS = 1, 2, 6, 9, 12  # BPF_MAP_TYPE_*
#: every map bpf/maps.h pins under pin_path (file name = map name)
PINNED_MAPS = ("zm_flows_a", "zm_flows_b", "zm_active", "zm_cache_a", "zm_cache_b",
               "zm_cache_active", "zm_endpoints", "zm_endpoint_ports", "zm_server_ports",
               "zm_lost", "zm_layout", "zm_epoch", "zm_entries", "zm_entry_ports", "zm_origins")
#: pinned maps added to layout 3 later, without changing any other map: pins of an agent
#: from before them lack them, and BCC creates them beside the others (no recreation)
ADDED_MAPS = frozenset({"zm_entries", "zm_entry_ports", "zm_origins"})

def libbcc() -> ctypes.CDLL:
    """Return BCC's libbcc (its libbpf wrappers ``bpf_lookup_elem``, ``bpf_obj_get_info``...).

    Imported on first use: BCC stays inside :mod:`agent.datapath`.
    """
    from bcc.libbcc import lib

    return cast(ctypes.CDLL, lib)


def call_errno(res: int) -> int:
    """Return the errno of a failed libbcc call whose result was res (libbpf returns
    -errno and also sets errno)."""
    return -res if res < -1 else ctypes.get_errno()


@dataclass(frozen=True, slots=True)
class MapInfo:
    """What the kernel says about a map (``struct bpf_map_info``, first fields).

    Attributes:
        type: ``BPF_MAP_TYPE_*`` (1 hash, 2 array, 12 array of maps).
        id: kernel-wide map id (what an array-of-maps slot holds when read from userspace).
        key_size, value_size: bytes.
        max_entries: entries.
        flags: ``map_flags``.
    """

    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


def map_info(fd: int) -> MapInfo:
    """Return :class:`MapInfo` of the map behind fd (``BPF_OBJ_GET_INFO_BY_FD``).

    Raises:
        OSError: fd is no map, or the kernel refused.
    """
    buf = (ctypes.c_uint8 * 256)()
    size = ctypes.c_uint32(ctypes.sizeof(buf))
    res = libbcc().bpf_obj_get_info(fd, ctypes.byref(buf), ctypes.byref(size))
    if res < 0:
        code = call_errno(res)
        raise OSError(code, f"BPF_OBJ_GET_INFO_BY_FD: {errno.errorcode.get(code)}")
    return MapInfo(*struct.unpack_from("=6I", bytes(buf)))


_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_OBJ_GET = 7
_libc = ctypes.CDLL(None, use_errno=True)


def _statfs_type(path: str) -> int:
    """f_type of the filesystem holding path (statfs(2)); raises OSError."""
    buf = (ctypes.c_uint8 * 256)()
    if _libc.statfs(path.encode(), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int.from_bytes(bytes(buf[:8]), sys.byteorder, signed=True) & 0xFFFFFFFF


def on_bpf_fs(path: str) -> bool:
    """Whether path, or its nearest existing parent, is on a BPF filesystem (bpffs)."""
    cur = Path(path)
    while not cur.exists():
        cur = cur.parent
    return _statfs_type(str(cur)) == BPF_FS_MAGIC


def obj_get(path: str) -> int:
    """Return a new fd of the BPF object pinned at path (``BPF_OBJ_GET``); caller closes it.

    Raises:
        OSError: nothing pinned there, or the kernel refused.
    """
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:  # pragma: no cover - other architectures
        raise OSError(errno.ENOSYS, f"bpf syscall number unknown on {platform.machine()}")
    raw = ctypes.create_string_buffer(path.encode())
    attr = (ctypes.c_uint64 * 3)(ctypes.addressof(raw), 0, 0)  # pathname, bpf_fd, file_flags
    fd = _libc.syscall(nr, _BPF_OBJ_GET, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def expected_maps(config: DatapathConfig) -> dict[str, tuple[int, int, int, int]]:
    """Return {map name: (BPF_MAP_TYPE_*, key bytes, value bytes, max_entries)} of every
    pinned map as this agent's bpf/maps.h defines it with ``config``."""
    flow = (_MAP_HASH, ctypes.sizeof(FlowKey), ctypes.sizeof(FlowValue),
            config.flow_capacity + OVERFLOW_SLOTS)
    return {
        "zm_flows_a": flow,
        "zm_flows_b": flow,
        "zm_active": (_MAP_ARRAY_OF_MAPS, 4, 4, 1),
        "zm_cache_a": (_MAP_PERCPU_ARRAY, 4, ctypes.sizeof(CacheSlot), CACHE_SLOTS),
        "zm_cache_b": (_MAP_PERCPU_ARRAY, 4, ctypes.sizeof(CacheSlot), CACHE_SLOTS),
        "zm_cache_active": (_MAP_ARRAY_OF_MAPS, 4, 4, 1),
        "zm_endpoints": (_MAP_HASH, ctypes.sizeof(EndpointKey), 4, config.endpoint_capacity),
        "zm_endpoint_ports": (_MAP_ARRAY, 4, 4, 65536),
        "zm_server_ports": (_MAP_ARRAY, 4, 4, 65536),
        "zm_lost": (_MAP_ARRAY, 4, ctypes.sizeof(FlowValue), 1),
        "zm_layout": (_MAP_ARRAY, 4, 4, 1),
        "zm_epoch": (_MAP_ARRAY, 4, 8, EPOCH_SLOTS),
        "zm_entries": (_MAP_HASH, ctypes.sizeof(EndpointKey), 4, config.endpoint_capacity),
        "zm_entry_ports": (_MAP_ARRAY, 4, 4, 65536),
        "zm_origins": (_MAP_LRU_HASH, ctypes.sizeof(FlowKey), 4, ORIGIN_CAPACITY),
    }


def _pin_mismatches(config: DatapathConfig) -> list[str]:
    """Why the pins under config.pin_path cannot be reused (empty list: they can)."""
    assert config.pin_path is not None
    problems = []
    for name, want in expected_maps(config).items():
        path = os.path.join(config.pin_path, name)
        if not os.path.exists(path):
            if name not in ADDED_MAPS:
                problems.append(f"{name} missing")
            continue
        try:
            fd = obj_get(path)
        except OSError as err:
            problems.append(f"{name}: {err.strerror}")
            continue
        try:
            info = map_info(fd)
            got = (info.type, info.key_size, info.value_size, info.max_entries)
            if got != want:
                problems.append(f"{name} is (type, key, value, entries) {got}, expected {want}")
            elif name == "zm_layout":
                zero, version = ctypes.c_int(0), ctypes.c_uint32(0)
                libbcc().bpf_lookup_elem(fd, ctypes.byref(zero), ctypes.byref(version))
                if version.value != LAYOUT_VERSION:
                    problems.append(f"layout version {version.value}, expected {LAYOUT_VERSION}")
        finally:
            os.close(fd)
    return problems


def make_pin_dir(path: str) -> None:
    """Create the pin directory path (and parents) on a BPF filesystem.

    Raises:
        InputError: path is not on a BPF filesystem.
        RuntimeFailure: the directory cannot be created.
    """
    try:
        if not on_bpf_fs(path):
            raise InputError(f"{path} is not on a BPF filesystem (mount -t bpf bpf /sys/fs/bpf)",
                             source="datapath", field="pin_path")
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise RuntimeFailure(f"cannot create pin directory {path}: {err}") from err


def lock_pins(path: str, timeout: float) -> int:
    """Take an exclusive flock on the pin directory path; return its fd (closing it
    releases the lock, as does the process's death, even by SIGKILL).

    Raises:
        RuntimeFailure: another process held the lock for ``timeout`` seconds.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RuntimeFailure(
                    f"another agent still uses the pinned maps in {path} "
                    f"(waited {timeout:g} s for it to exit)") from None
            time.sleep(0.1)


def prepare_pins(config: DatapathConfig) -> bool:
    """Make config.pin_path ready for BCC; return True when a previous agent's pins are
    reused (the kernel kept counting into them), False when BCC will create fresh ones.

    Pins that do not match this agent's layout (another ``ZM_LAYOUT_VERSION``, other
    struct sizes or capacities, a partial set) are unlinked and recreated, with one
    warning: the counts they held since the previous agent's last drain cannot be read
    with this layout and are dropped. Refusing would leave the node uncounted until
    someone removed the pins by hand.

    Raises:
        InputError: pin_path is not on a BPF filesystem.
        RuntimeFailure: the directory cannot be created or a stale pin removed.
    """
    assert config.pin_path is not None
    path = config.pin_path
    make_pin_dir(path)
    present = [n for n in PINNED_MAPS if os.path.exists(os.path.join(path, n))]
    if not set(present) - ADDED_MAPS:
        return False
    problems = _pin_mismatches(config)
    if not problems:
        return True
    log.warning("pinned maps in %s do not fit this agent (%s): recreating them; counts "
                "held there since the previous agent's last drain are dropped",
                path, "; ".join(problems))
    for name in present:
        try:
            os.unlink(os.path.join(path, name))
        except OSError as err:
            raise RuntimeFailure(f"cannot remove stale pin {path}/{name}: {err}") from err
    return False
