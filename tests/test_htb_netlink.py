"""The agent's own encoding of an HTB class change (controller/nic/agent/htb_netlink.py, root):
the kernel reads back every class it writes exactly as it reads back pyroute2's for the same
parameters (rates below and above 32 bits, a ceiling at the floor, weights, priorities), a
change the kernel refuses raises its errno, and the pacer's re-rates go through it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from testbed.emu.nicrig import NetnsPair

pytestmark = [pytest.mark.root]

# Runs in a namespace with the veth `dev`: an HTB root, the port's class and a flow's, each
# case written by pyroute2 and by the writer (the class set elsewhere between), read back.
_DIFF = textwrap.dedent(
    """
    import json, sys
    from pyroute2 import IPRoute
    from controller.nic.agent.htb_netlink import ClassChange, HtbClassWriter
    from controller.nic.agent.pacer import (
        MTU, PORT_MINOR, ROOT_HANDLE, HtbPacer, _burst, _quantum, classid,
    )
    dev, cases = sys.argv[1], json.loads(sys.argv[2])
    ipr = IPRoute()
    idx = ipr.link_lookup(ifname=dev)[0]
    port, leaf = classid(PORT_MINOR), classid(0x10)
    ipr.tc("add", "htb", idx, ROOT_HANDLE, default=0xFFFE)
    ipr.tc("add-class", "htb", idx, port, parent=ROOT_HANDLE, rate=125_000_000,
           ceil=125_000_000, burst=250_000, cburst=250_000, quantum=1514, prio=0, mtu=MTU)
    ipr.tc("add-class", "htb", idx, leaf, parent=port, rate=1000, ceil=2_000_000,
           burst=4000, cburst=4000, quantum=1514, prio=1, mtu=MTU)

    def read(handle):
        (c,) = [c for c in ipr.get_classes(idx) if c["handle"] == handle]
        o = c.get_attr("TCA_OPTIONS")
        p = {k: v for k, v in o.get_attr("TCA_HTB_PARMS").items() if k != "header"}
        return [p, o.get_attr("TCA_HTB_RATE64"), o.get_attr("TCA_HTB_CEIL64")]

    def other():  # the class somewhere else between the two writes
        ipr.tc("change-class", "htb", idx, leaf, parent=port, rate=1000, ceil=1000,
               burst=3200, cburst=3200, quantum=1514, prio=1, mtu=MTU)

    w = HtbClassWriter()
    out = {"cases": []}
    for rate, ceil, weight, prio in cases:
        args = (rate, ceil, _burst(rate), _burst(ceil), _quantum(weight), prio)
        other()
        ipr.tc("change-class", "htb", idx, leaf, parent=port, rate=rate, ceil=ceil,
               burst=args[2], cburst=args[3], quantum=args[4], prio=prio, mtu=MTU)
        theirs = read(leaf)
        other()
        w.change(ClassChange(idx, leaf, port, *args))
        out["cases"].append([theirs, read(leaf)])
    try:
        w.change(ClassChange(idx, classid(0x99), port, 1000, 1000, 3200, 3200, 1514, 1))
        out["missing"] = 0
    except OSError as exc:
        out["missing"] = exc.errno
    # the pacer: a flow's class made (pyroute2), then re-rated (the writer)
    pacer = HtbPacer(ipr, [idx], 1_000_000_000)
    fc, _ = pacer.apply("flow", 50_000_000)
    pacer.apply("flow", 20_000_000, 2)
    out["pacer"] = [read(classid(fc.minor))[0]["ceil"], read(classid(fc.minor))[0]["quantum"]]
    out["pacer_want"] = [20_000_000 // 8, _quantum(2)]
    print(json.dumps(out))
    """
)


def test_the_kernel_reads_back_the_writers_classes_as_pyroute2s() -> None:
    # (rate, ceil) in bytes/s as the pacer passes them, weight, prio
    cases = [
        (1000, 19_531_250 // 8, 1, 1),  # a flow at the default suite's line rate
        (1000, 1000, 1, 1),  # at the floor
        (1000, 976_492_712 // 8, 3, 1),  # 1 Gb/s, a weight
        (1000, 125_000, 1, 0),  # the default class's priority
        (1000, 40_000_000_000 // 8, 2, 1),  # a ceiling past 32 bits
        (64_000_000_000 // 8, 80_000_000_000 // 8, 1, 0),  # both past 32 bits
    ]
    with NetnsPair.create() as pair:
        res = subprocess.run(
            ["ip", "netns", "exec", pair.a, sys.executable, "-c", _DIFF, pair.dev_a]
            + [json.dumps(cases)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for (theirs, ours), case in zip(out["cases"], cases, strict=True):
        assert ours == theirs, case
    # the cases are not all alike: the kernel saw each
    assert len({json.dumps(t) for t, _ in out["cases"]}) == len(cases)
    assert out["cases"][4][0][2] == cases[4][1]  # TCA_HTB_CEIL64 carried the ceiling
    assert out["missing"] == 2  # ENOENT: no such class
    assert out["pacer"] == out["pacer_want"]
