"""agent.datapath.cgroup without a kernel: finding the cgroup v2 hierarchy."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.datapath.cgroup import cgroup2_root
from agent.errors import RuntimeFailure

#: a hybrid layout (cgroup v1 controllers plus the unified hierarchy), as proc(5) shows it
HYBRID = """\
25 1 0:22 / / rw,relatime shared:1 - ext4 /dev/vda rw
31 25 0:27 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
40 31 0:37 / /sys/fs/cgroup/cpu,cpuacct rw shared:15 - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
"""


def test_hybrid_layout_gives_the_unified_mount(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text(HYBRID)
    assert cgroup2_root(str(f)) == "/sys/fs/cgroup/unified"


def test_unified_layout_and_escaped_mount_points(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text("30 25 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n"
                 "50 25 0:40 / /mnt/my\\040cg rw - cgroup2 none rw\n")
    assert cgroup2_root(str(f)) == "/sys/fs/cgroup"
    f.write_text("50 25 0:40 / /mnt/my\\040cg rw - cgroup2 none rw\n")
    assert cgroup2_root(str(f)) == "/mnt/my cg"


def test_no_cgroup2_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text(HYBRID.replace("cgroup2", "cgroup"))
    with pytest.raises(RuntimeFailure, match="no cgroup2 filesystem"):
        cgroup2_root(str(f))
