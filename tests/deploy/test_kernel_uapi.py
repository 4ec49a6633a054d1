"""BCC compiles the datapath from the UAPI header tree alone, to the same instructions.

deploy/daemonset/kernel-uapi.sh lays out this machine's UAPI headers (Debian's
linux-libc-dev, /usr/include) as a kernel tree. In a private mount namespace where the
node's headers are hidden (an empty directory bind-mounted over /usr/src and over
/lib/modules/$(uname -r)), the agent's real programs (agent.datapath.config.TC_SOURCE
with the agent's cflags) still compile and load with ``BCC_KERNEL_SOURCE`` pointing at the
tree, and without it they do not (the control: the headers really are hidden). Compiled
against the machine's kernel headers instead, the two programs are the same bytes: the
tree changes nothing in what the kernel runs. The counting itself, from that tree, is
shown by tests/deploy/test_image_lab.py (``no-node-headers``).

Needs root, util-linux ``unshare``, BCC and kernel headers on the machine (tools/setup.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "daemonset" / "kernel-uapi.sh"

#: compile and load the agent's programs; print each program's instructions (hex)
COMPILE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from bcc import BPF
    from agent.datapath.attach import _PROGRAMS
    from agent.datapath.config import TC_SOURCE, DatapathConfig, flags_for
    b = BPF(src_file=str(TC_SOURCE).encode(), cflags=flags_for(DatapathConfig(), (32768, 60999)))
    out = {{}}
    for _, name in _PROGRAMS:
        fn = b.load_func(name.encode(), BPF.SCHED_CLS)
        assert fn.fd > 0
        out[name] = b.dump_func(name.encode()).hex()
    print("PROGRAMS " + json.dumps(out))
""")


def _require() -> None:
    if os.geteuid() != 0:
        pytest.fail("tests/deploy need root (mount namespaces, BPF)", pytrace=False)
    if shutil.which("unshare") is None:
        pytest.fail("tests/deploy need util-linux unshare", pytrace=False)
    release = os.uname().release
    if not Path(f"/lib/modules/{release}/build/include").is_dir():
        pytest.fail("no kernel headers linked for the running kernel: run tools/setup.sh",
                    pytrace=False)


def _compile(tmp: Path, *, hide_headers: bool, tree: Path | None) -> subprocess.CompletedProcess[str]:
    """Run COMPILE in a fresh process (same fd numbers each time: comparable bytes)."""
    prog = tmp / "compile.py"
    prog.write_text(COMPILE.format(root=str(ROOT)))
    env = {k: v for k, v in os.environ.items() if k != "BCC_KERNEL_SOURCE"}
    if tree is not None:
        env["BCC_KERNEL_SOURCE"] = str(tree)
    run = f"exec {sys.executable} {prog}"
    if hide_headers:
        empty = tmp / "empty"
        empty.mkdir(exist_ok=True)
        release = os.uname().release
        script = (f"set -e; mount --bind {empty} /usr/src; "
                  f"mount --bind {empty} /lib/modules/{release}; "
                  f"test ! -e /lib/modules/{release}/build; test -z \"$(ls /usr/src)\"; {run}")
        argv = ["unshare", "--mount", "--propagation", "private", "bash", "-c", script]
    else:
        argv = ["bash", "-c", run]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp)


def _programs(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("PROGRAMS ")]
    return json.loads(line.split(" ", 1)[1])


def test_datapath_compiles_from_the_uapi_tree_to_the_same_instructions(tmp_path: Path) -> None:
    _require()
    tree = tmp_path / "kernel-uapi"
    made = subprocess.run(["bash", str(SCRIPT), str(tree)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (tree / "ORIGIN").read_text().startswith("linux-libc-dev ")

    # control: with the node's headers hidden and no tree, BCC finds nothing to compile with
    # (a kernel with CONFIG_IKHEADERS would let BCC use its own kheaders.tar.xz instead)
    if not Path("/sys/kernel/kheaders.tar.xz").exists():
        hidden = _compile(tmp_path, hide_headers=True, tree=None)
        assert hidden.returncode != 0
        assert "PROGRAMS" not in hidden.stdout
        assert "Unable to find kernel headers" in hidden.stdout + hidden.stderr

    from_tree = _programs(_compile(tmp_path, hide_headers=True, tree=tree))
    from_node = _programs(_compile(tmp_path, hide_headers=False, tree=None))
    assert set(from_tree) == {"zm_tc_from_pod", "zm_tc_to_pod"}
    assert all(len(v) > 1000 for v in from_tree.values())
    assert from_tree == from_node
