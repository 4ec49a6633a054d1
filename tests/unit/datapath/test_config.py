"""agent.datapath.config without a kernel: settings validation and the cflags they become."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.datapath.config import DatapathConfig, flags_for, scope_cgroup_id
from agent.errors import InputError


@pytest.mark.parametrize("field,value", [
    ("hook", "cgroup_skb"), ("flow_capacity", 4), ("endpoint_capacity", 0),
    ("ephemeral_ports", (60000, 1000)), ("tc_priority", 0), ("tc_handle", 0),
    ("pin_path", "relative/dir"), ("pin_path", '/sys/fs/bpf/a"b'), ("pin_path", "/sys/fs/bpf/../x"),
    ("pin_path", "/sys/fs/bpf/a b"), ("pin_lock_seconds", -1.0), ("attach", "tc"),
    ("attach", "TCX"), ("hook", "tc"), ("scope_netns", ("a b",)), ("scope_netns", ("../x",)),
    ("cgroup_root", "sys/fs/cgroup"), ("scope_cgroup", "sys/fs/cgroup/x"),
])
def test_bad_setting_names_its_field(field: str, value: object) -> None:
    with pytest.raises(InputError) as err:
        DatapathConfig(**{field: value}).validate()  # type: ignore[arg-type]
    assert err.value.field == field


def test_cflags_carry_every_option() -> None:
    flags = flags_for(DatapathConfig(flow_capacity=1000, endpoint_capacity=50), (40000, 50000))
    assert "-DZM_FLOW_CAPACITY=1000" in flags
    assert "-DZM_ENDPOINT_CAPACITY=50" in flags
    assert "-DZM_EPHEMERAL_MIN=40000" in flags and "-DZM_EPHEMERAL_MAX=50000" in flags
    assert any(f.startswith("-I") and f.endswith("bpf") for f in flags)


def test_pin_path_becomes_a_c_string_define_and_nothing_else_without_it() -> None:
    flags = flags_for(DatapathConfig(pin_path="/sys/fs/bpf/zonemeter/node-a/"), (1, 2))
    assert '-DZM_PIN_DIR="/sys/fs/bpf/zonemeter/node-a"' in flags
    assert not any("ZM_PIN_DIR" in f for f in flags_for(DatapathConfig(), (1, 2)))


@pytest.mark.parametrize("mode", ["auto", "tcx", "clsact"])
def test_every_attach_mode_is_accepted_and_auto_is_the_default(mode: str) -> None:
    DatapathConfig(attach=mode).validate()
    assert DatapathConfig().attach == "auto"


@pytest.mark.parametrize("hook", ["veth", "cgroup", "auto"])
def test_every_hook_is_accepted_and_veth_is_the_default(hook: str) -> None:
    DatapathConfig(hook=hook).validate()
    assert DatapathConfig().hook == "veth"


def test_socket_counters_are_compiled_in_only_when_set_and_only_on_the_cgroup_hook() -> None:
    assert "-DZM_SOCK_COUNTERS=1" in flags_for(DatapathConfig(hook="cgroup", socket_counters=True),
                                               (1, 2))
    assert not any("ZM_SOCK_COUNTERS" in f for f in flags_for(DatapathConfig(hook="cgroup"), (1, 2)))
    for hook in ("veth", "auto"):
        with pytest.raises(InputError, match="socket_counters"):
            DatapathConfig(hook=hook, socket_counters=True).validate()


def test_cgroup_scope_names_a_cgroup_on_a_cgroup2_mount(tmp_path: Path) -> None:
    from agent.datapath.cgroup import cgroup2_root

    root = cgroup2_root()
    assert scope_cgroup_id(root) == (os.stat(root).st_ino, 0)
    with pytest.raises(InputError, match="scope_cgroup"):
        scope_cgroup_id(str(tmp_path))  # a directory on no cgroup2 mount
    with pytest.raises(InputError, match="scope_cgroup"):
        scope_cgroup_id(os.path.join(root, "zm-no-such-cgroup"))


def test_netns_scope_is_compiled_in_only_when_set() -> None:
    assert "-DZM_SCOPE_NETNS=1" in flags_for(DatapathConfig(hook="cgroup", scope_netns=("n1",)), (1, 2))
    assert not any("ZM_SCOPE_NETNS" in f for f in flags_for(DatapathConfig(hook="cgroup"), (1, 2)))
