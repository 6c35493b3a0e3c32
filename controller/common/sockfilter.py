"""Classic BPF socket filters (linux/filter.h), for raw sockets that must see only some of
what arrives: the transport's receive socket (UDP to 4791) and the agent's prober's (probes).
"""

from __future__ import annotations

import ctypes
import socket
import struct

SO_ATTACH_FILTER = 26

Program = list[tuple[int, int, int, int]]  # (code, jt, jf, k); jumps count instructions skipped


def attach_filter(sock: socket.socket, program: Program) -> None:
    code = b"".join(struct.pack("HBBI", c, jt, jf, k) for c, jt, jf, k in program)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def drain(sock: socket.socket) -> None:
    """Drop what was queued before a filter was attached (leaves the socket non-blocking)."""
    sock.setblocking(False)
    while True:
        try:
            sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
