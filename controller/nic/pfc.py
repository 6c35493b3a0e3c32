"""PFC pauses arriving at the NIC: the Python reference of ebpf/lib/pfc.h, operation for
operation (tests/test_nic_pfc.py compares them frame by frame); the twin's NICs run it.

A PFC frame (controller/wire/pfc.py) names priorities and a pause time for each in quanta
of 512 bit times at the NIC's line rate; a time of 0 resumes the priority. Per priority the
NIC keeps until when it is held and the time held so far.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from controller.nic.bpf import header, syscalls
from controller.wire.pfc import PRIORITIES, decode_pfc, is_mac_control, pause_ns


@dataclass
class PfcState:
    """xm_pfc_state: one priority's pause."""

    pause_until_ns: int = 0
    since_ns: int = 0
    paused_ns: int = 0
    pauses: int = 0
    resumes: int = 0
    active: bool = False

    def set(self, now_ns: int, until_ns: int) -> None:
        """xm_pfc_set: hold until `until_ns` (now: release), closing the time held so far."""
        if self.active and now_ns > self.since_ns:
            self.paused_ns += min(now_ns, self.pause_until_ns) - self.since_ns
        self.active = False
        self.pause_until_ns = until_ns
        if until_ns > now_ns:
            self.since_ns = now_ns
            self.active = True

    def holds(self, now_ns: int) -> bool:
        return self.active and now_ns < self.pause_until_ns

    def held_ns(self, now_ns: int) -> int:
        """The time held so far, up to `now_ns`."""
        if not self.active or now_ns <= self.since_ns:
            return self.paused_ns
        return self.paused_ns + min(now_ns, self.pause_until_ns) - self.since_ns


@dataclass
class PfcNic:
    """xm_pfc: every priority's pause on one NIC."""

    prio: list[PfcState] = field(default_factory=lambda: [PfcState() for _ in range(PRIORITIES)])

    def on_frame(self, frame: bytes, line_rate_bps: int, now_ns: int) -> list[str] | None:
        """xm_pfc_frame: None for a frame that is not MAC Control (it goes on to the rate
        law), else the counters it bumps (XM_CNT_XDP_<name>), in order."""
        if not is_mac_control(frame):
            return None
        try:
            pause = decode_pfc(frame)
        except ValueError:
            return ["PFC_MALFORMED"]
        if not line_rate_bps:
            return ["NO_CONFIG"]
        counted = []
        for p in pause.priorities():
            st = self.prio[p]
            q = pause.quanta[p]
            if q:
                st.pauses += 1
                st.set(now_ns, now_ns + pause_ns(q, line_rate_bps))
                counted.append("PFC_PAUSE")
            else:
                st.resumes += 1
                st.set(now_ns, now_ns)
                counted.append("PFC_RESUME")
        return counted

    def release(self, now_ns: int) -> None:
        for st in self.prio:
            st.set(now_ns, now_ns)


class PinnedPfc:
    """A NIC's `xm_pfc` as its agent pinned it, read with bpf(2) (no bcc): what the emulation's
    transport asks before it sends, since tc cannot hold a packet (without `sch_fq` it could
    only drop it). The layout is `struct xm_pfc_state`'s, read from the header."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        names, self._layout = header.struct_layout("xm_pfc_state")
        if names != _PFC_FIELDS:
            raise ValueError(f"xm_pfc_state has fields {names}, this reader knows {_PFC_FIELDS}")
        self._fd = syscalls.obj_get(str(self.path))
        info = syscalls.map_info(self._fd)
        if (info.key_size, info.value_size) != (4, self._layout.size):
            self.close()
            raise ValueError(
                f"{self.path}: key/value sizes {info.key_size}/{info.value_size}, "
                f"struct xm_pfc_state says 4/{self._layout.size}"
            )

    def state(self, prio: int = 0) -> PfcState:
        raw = syscalls.map_lookup(self._fd, struct.pack("<I", prio), self._layout.size)
        until, since, paused, pauses, resumes, active, _pad = self._layout.unpack(raw)
        return PfcState(until, since, paused, pauses, resumes, bool(active))

    def native_view(self) -> tuple[int, int, int, int]:
        """(the map's fd, its value's size, the offsets of `pause_until_ns` (8 bytes) and
        `active` (4)): for C that reads priority 0's state itself, as `hold_until_ns` does."""
        offs = header.struct_offsets("xm_pfc_state")
        until, active = offs["pause_until_ns"], offs["active"]
        if until[1] != 8 or active[1] != 4:
            raise ValueError(f"xm_pfc_state's fields are not the sizes a reader expects: {offs}")
        return self._fd, self._layout.size, until[0], active[0]

    def hold_until_ns(self, now_ns: int, prio: int = 0) -> int:
        """Until when the switch holds the priority (CLOCK_MONOTONIC ns); 0 when it does not."""
        st = self.state(prio)
        return st.pause_until_ns if st.holds(now_ns) else 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_PFC_FIELDS = ("pause_until_ns", "since_ns", "paused_ns", "pauses", "resumes", "active", "pad")
