"""The datapath's debug command: print the effective C, or attach and print deltas.

::

    python -m agent.datapath --print-c
    python -m agent.datapath --netns zm1a2b-node-a --interval 2
    python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zonemeter/node-a
    python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zonemeter/node-a --cleanup
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import signal
import sys
import threading

from agent.datapath.attach import Datapath
from agent.datapath.config import BPF_DIR, DatapathConfig, flags_for
from agent.datapath.netns import read_ephemeral_range
from agent.errors import InputError, RuntimeFailure
from agent.records import FlowDelta

#: the files of bpf/ the programs are built from, in include order
BPF_SOURCES = ("zonemeter.h", "maps.h", "parse.h", "account.h", "classify.h", "tc.c")


def effective_source() -> str:
    """Return the C the programs are built from: tc.c with its local headers inlined."""
    parts = []
    for name in BPF_SOURCES:
        parts.append(f"/* ---- bpf/{name} ---- */\n" + (BPF_DIR / name).read_text())
    return "\n".join(parts)


def _delta_json(d: FlowDelta) -> str:
    """Return one delta as the JSON object the debug command prints (one line)."""
    return json.dumps({"kind": d.kind.value, "local": str(d.local), "remote": str(d.remote),
                       "port": d.port, "protocol": d.protocol, "bytes": d.bytes,
                       "packets": d.packets, "overflow": d.overflow})


def main(argv: list[str] | None = None) -> int:
    """Debug entry point: print the C, or attach, and print drained deltas as JSON lines.

    Exits 0 on SIGTERM/SIGINT after removing every filter it added, or with
    ``--pin-path`` after leaving filters and pins for the next run (``--cleanup`` removes
    them). Each drain prints one JSON line per delta, then ``{"drained": N}``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m agent.datapath",
        description="Attach the zonemeter datapath to pod veths and print flow deltas.",
        epilog="examples:\n  python -m agent.datapath --print-c\n"
               "  python -m agent.datapath --netns zm1a2b-node-a --interval 1\n"
               "  python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zm/a\n"
               "  python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zm/a --cleanup",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--netns", help="network namespace of the node (default: ours)")
    parser.add_argument("--interval", type=float, default=5.0, help="drain period, seconds")
    parser.add_argument("--capacity", type=int, default=65536, help="flow entries per table")
    parser.add_argument("--interface", action="append", default=[],
                        help="extra interface name pattern to attach (fnmatch)")
    parser.add_argument("--exclude", action="append", default=[],
                        help="interface name pattern never attached (fnmatch)")
    parser.add_argument("--endpoint", action="append", default=[],
                        help="local endpoint ADDRESS,PORT,PROTO (proto number)")
    parser.add_argument("--pin-path",
                        help="pin the maps in this directory on a BPF filesystem "
                             "(e.g. /sys/fs/bpf/zonemeter/NODE): SIGTERM then leaves the "
                             "filters counting for the next run, which reuses the pins")
    parser.add_argument("--attach", choices=("auto", "tcx", "clsact"), default="auto",
                        help="TCX links (Linux 6.6+), clsact filters, or auto (tcx when the "
                             "kernel has it); docs/datapath.md")
    parser.add_argument("--cleanup", action="store_true",
                        help="remove our filters (in --netns), the pinned TCX links and the "
                             "pins (--pin-path), then exit")
    parser.add_argument("--print-c", action="store_true",
                        help="print the effective BPF C and cflags, then exit")
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except InputError as err:
        print(f"python -m agent.datapath: error: {err}", file=sys.stderr)
        return 2
    except RuntimeFailure as err:
        print(f"python -m agent.datapath: error: {err}", file=sys.stderr)
        return 1


def _parse_endpoint(text: str) -> tuple[str, int, int]:
    """Parse ``ADDRESS,PORT,PROTO``; raises InputError naming the flag."""
    try:
        addr, port, proto = text.split(",")
        ipaddress.ip_address(addr)
        return addr, int(port), int(proto)
    except ValueError:
        raise InputError(f"{text!r} is not ADDRESS,PORT,PROTO (e.g. 10.1.0.5,8080,6)",
                         source="--endpoint") from None


def _main(args: argparse.Namespace) -> int:
    """Run the debug command for parsed ``args``; returns the exit code (0)."""
    config = DatapathConfig(netns=args.netns, flow_capacity=args.capacity,
                            interface_patterns=tuple(args.interface),
                            exclude_patterns=tuple(args.exclude), pin_path=args.pin_path,
                            attach=args.attach)
    config.validate()
    eps = [_parse_endpoint(text) for text in args.endpoint]
    if args.cleanup:
        res = Datapath.cleanup(config.pin_path, config.netns, tc_priority=config.tc_priority,
                               tc_handle=config.tc_handle)
        print(json.dumps({"removed_filters": [list(f) for f in res.filters],
                          "removed_pins": list(res.pins),
                          "removed_links": list(res.links)}), flush=True)
        return 0
    if args.print_c:
        eph = config.ephemeral_ports or read_ephemeral_range(config.netns)
        print("/* cflags: " + " ".join(flags_for(config, eph)) + " */")
        print(effective_source())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    dp = Datapath(config)
    try:
        dp.set_service_ports({port for _, port, _ in eps})  # no cluster here: theirs
        dp.set_local_endpoints(eps)
        dp.watch()
        print(json.dumps({"attached": list(dp.attached()), "reused": dp.reused,
                          "attach_mode": dp.attach_mode}), flush=True)
        while True:
            stopping = stop.wait(args.interval)
            deltas = dp.drain()  # a last one on exit: nothing counted so far is lost
            for d in deltas:
                print(_delta_json(d), flush=True)
            print(json.dumps({"drained": len(deltas)}), flush=True)  # end of one drain
            if stopping:
                break
    finally:
        # with pins, leave the filters counting for the next run (rolling update)
        dp.release()
    print(json.dumps({"detached": config.pin_path is None}), flush=True)
    return 0
