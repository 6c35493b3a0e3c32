"""Path impairments for transport tests, made of tc + eBPF (no netem on these kernels).

`RandomLoss`: a clsact classifier that drops a given fraction of IPv4 packets. Put it on the
  receiving side (ingress, the default): a drop at the sender's own egress is reported to the
  sending socket (ENOBUFS) and the transport sends the packet again, as it must for its NIC's
  queue, so it would not be a loss on the path.

The program is compiled with bcc, pinned in a bpffs mounted privately for this object and
attached with `tc ... bpf da object-pinned`, run in the host's network namespace with
`nsenter --net` (so the pin stays visible). `close()` removes the qdisc, the pin and the mount.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from testbed.traffic.netns import Host

KERNEL_HEADERS_CACHE = Path("/var/cache/xingmai/kernel-headers")

_PROGRAM = r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/pkt_cls.h>

int impair(struct __sk_buff *skb) {
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    return bpf_get_prandom_u32() % 1000000 < PPM ? TC_ACT_SHOT : TC_ACT_OK;
}
"""


def _bcc() -> Any:
    if not Path(f"/lib/modules/{os.uname().release}/build/include").exists():
        if KERNEL_HEADERS_CACHE.exists():
            os.environ.setdefault("BCC_KERNEL_SOURCE", str(KERNEL_HEADERS_CACHE))
        else:
            raise RuntimeError(
                "no kernel headers for bcc: run `make install` (it merges Debian's headers "
                f"into {KERNEL_HEADERS_CACHE})"
            )
    from bcc import BPF  # Debian's python3-bpfcc, exposed to the venv by `make install`

    return BPF


class _TcProgram:
    def __init__(self, host: Host, ifname: str, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("fraction must be in [0, 1]")
        self.host = host
        self.ifname = ifname
        BPF = _bcc()  # noqa: N806 - the class bcc exports
        self._bpf = BPF(text=_PROGRAM.encode(), cflags=[f"-DPPM={round(fraction * 1_000_000)}u"])
        fn = self._bpf.load_func(b"impair", BPF.SCHED_CLS)
        self.mount = Path(tempfile.mkdtemp(prefix="xm-impair-", dir="/run"))
        subprocess.run(["mount", "-t", "bpf", "bpf", str(self.mount)], check=True)
        self.pin = self.mount / "prog"
        from bcc import libbcc

        if libbcc.lib.bpf_obj_pin(fn.fd, str(self.pin).encode()) != 0:
            self._unmount()
            raise OSError(f"could not pin the program at {self.pin}")
        self.qdisc_cmd: list[str] = []

    def tc(self, *args: str) -> None:
        subprocess.run(self.host.command(["tc", *args]), check=True, capture_output=True, text=True)

    def _unmount(self) -> None:
        subprocess.run(["umount", str(self.mount)], capture_output=True)
        self.mount.rmdir()

    def close(self) -> None:
        if self.qdisc_cmd:
            subprocess.run(self.host.command(["tc", *self.qdisc_cmd]), capture_output=True)
            self.qdisc_cmd = []
        if self.mount.exists():
            self._unmount()
        self._bpf.cleanup()

    def __enter__(self) -> _TcProgram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RandomLoss(_TcProgram):
    """Drop `fraction` of the IPv4 packets arriving at (or leaving) `ifname` on `host`."""

    def __init__(
        self, host: Host, ifname: str, fraction: float, direction: str = "ingress"
    ) -> None:
        if direction not in ("ingress", "egress"):
            raise ValueError("direction is ingress or egress")
        super().__init__(host, ifname, fraction)
        try:
            self.tc("qdisc", "add", "dev", ifname, "clsact")
            self.qdisc_cmd = ["qdisc", "del", "dev", ifname, "clsact"]
            self.tc(
                "filter",
                "add",
                "dev",
                ifname,
                direction,
                "bpf",
                "da",
                "object-pinned",
                str(self.pin),
            )
        except BaseException:
            self.close()
            raise
