"""The image entrypoint's header links are the ones BCC really compiles against.

Runs entrypoint.sh in a private mount namespace laid out like the agent pod: the
node's /lib/modules bind-mounted read-only at <tmp>/host/lib/modules, an empty tmpfs
over /lib/modules (the pod's emptyDir), /usr/src as is. The entrypoint links the
headers, then execs a stand-in agent that compiles a BPF program with BCC. The real
/lib/modules is only read: the tmpfs and its links vanish with the namespace.

Needs root, util-linux `unshare` and BCC (as the kernel tests do); runs in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "daemonset" / "entrypoint.sh"

pytestmark = pytest.mark.kernel

COMPILE = r'''
import os, sys
from bcc import BPF
# Fails to compile unless /lib/modules/$(uname -r)/build (and source) hold headers.
b = BPF(text="""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>
int count(struct __sk_buff *skb) { return skb->len > ETH_HLEN ? TC_ACT_UNSPEC : TC_ACT_UNSPEC; }
""")
fn = b.load_func("count", BPF.SCHED_CLS)
release = os.uname().release
print("LINKS", os.readlink(f"/lib/modules/{release}/build"))
print("ARGS", " ".join(sys.argv[1:]))
print("LOADED", fn.fd > 0)
'''


def _requirements() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespace, BPF)")
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    try:
        import bcc  # noqa: F401
    except ImportError:
        pytest.skip("needs BCC (python3-bpfcc, linked by tools/setup.sh)")
    release = os.uname().release
    if not Path(f"/lib/modules/{release}/build/include").is_dir():
        pytest.skip("the machine has no kernel headers linked (run tools/setup.sh)")


def test_bcc_compiles_against_the_entrypoint_links(tmp_path: Path) -> None:
    _requirements()
    (tmp_path / "compile.py").write_text(COMPILE)
    agent = tmp_path / "zonemeter"
    agent.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "compile.py"} "$@"\n')
    agent.chmod(0o755)
    script = textwrap.dedent(
        f"""
        set -eu
        mkdir -p {tmp_path}/host/lib/modules
        mount --bind /lib/modules {tmp_path}/host/lib/modules
        mount -o remount,bind,ro {tmp_path}/host/lib/modules
        mount -t tmpfs -o size=1m zonemeter-test /lib/modules
        ZONEMETER_HOST_ROOT={tmp_path}/host ZONEMETER_AGENT={agent} \\
          bash {ENTRYPOINT} --interval=10
        """
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    release = os.uname().release
    # The same headers the node links, reached through the pod's layout.
    assert lines["LINKS"] == os.path.realpath(f"/lib/modules/{release}/build")
    assert lines["ARGS"] == "agent --interval=10"
    assert lines["LOADED"] == "True"
    # The real /lib/modules was only read: its links are unchanged.
    assert os.path.realpath(f"/lib/modules/{release}/build") == lines["LINKS"]


def test_bcc_fails_without_the_links(tmp_path: Path) -> None:
    """Control: the same compile in the same layout, without the entrypoint, fails."""
    _requirements()
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        pytest.skip("the kernel carries its own headers (kheaders): BCC needs no links here")
    (tmp_path / "compile.py").write_text(COMPILE)
    script = f"mount -t tmpfs -o size=1m zonemeter-test /lib/modules && exec {sys.executable} {tmp_path / 'compile.py'}"
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "LOADED" not in result.stdout
