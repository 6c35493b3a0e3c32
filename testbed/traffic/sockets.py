"""The transport's sockets: raw IPv4 for sending, raw UDP (filtered) for receiving.

Sending uses IPPROTO_RAW (IP_HDRINCL): the transport writes the IPv4 header itself, so the ICRC,
which covers the IPv4 header, is known before the packet leaves, the UDP source port can be any
per-QP entropy port, and every packet carries ECT(0) and DF. Such a socket never receives.
Each queue pair has its own sending socket so that a full send buffer (the NIC's pacing queue
pushing back) blocks only that queue pair.

Receiving uses a raw IPPROTO_UDP socket, which sees the whole IPv4 header (DSCP for INT, ECN
for CNPs, the fields the ICRC covers), with a classic BPF filter that keeps only UDP dport 4791.
A UDP socket bound to 4791 stays open so the kernel does not answer ICMP port-unreachable; a
drop-all filter keeps it from queueing a second copy of every packet.
"""

from __future__ import annotations

import array
import errno
import fcntl
import socket
import termios

from controller.common.sockfilter import attach_filter, drain

SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
IP_RECVERR = 11

# Classic BPF opcodes (linux/filter.h).
_BPF_LDX_B_MSH = 0xB1  # X <- 4 * (pkt[k] & 0xf)
_BPF_LD_H_IND = 0x48  # A <- u16 at pkt[X + k]
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06


def _set_buf(sock: socket.socket, force_opt: int, opt: int, size: int) -> None:
    try:  # root may exceed net.core.[rw]mem_max
        sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)


def open_tx_socket(sndbuf: int) -> socket.socket:
    """Non-blocking IPPROTO_RAW socket; qdisc drops are reported as ENOBUFS (IP_RECVERR)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    _set_buf(s, SO_SNDBUFFORCE, socket.SO_SNDBUF, sndbuf)
    s.setblocking(False)
    return s


def open_rx_sockets(port: int, rcvbuf: int) -> tuple[socket.socket, socket.socket]:
    """(raw receiving socket filtered to UDP dport `port`, placeholder UDP socket on `port`)."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attach_filter(udp, [(_BPF_RET_K, 0, 0, 0)])
    udp.bind(("0.0.0.0", port))
    drain(udp)
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    _set_buf(raw, SO_RCVBUFFORCE, socket.SO_RCVBUF, rcvbuf)
    attach_filter(
        raw,
        [
            (_BPF_LDX_B_MSH, 0, 0, 0),
            (_BPF_LD_H_IND, 0, 0, 2),
            (_BPF_JEQ_K, 0, 1, port),
            (_BPF_RET_K, 0, 0, 0x40000),
            (_BPF_RET_K, 0, 0, 0),
        ],
    )
    drain(raw)
    return raw, udp


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes the socket has handed on and the NIC has not sent yet (SIOCOUTQ: what waits in
    the qdisc, paced); 0 where it cannot tell."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf, True)  # SIOCOUTQ is TIOCOUTQ
    except OSError:
        return 0
    return buf[0]


def is_would_block(exc: OSError) -> bool:
    return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
