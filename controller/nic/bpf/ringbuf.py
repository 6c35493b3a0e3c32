"""The consumer side of a BPF ring buffer (BPF_MAP_TYPE_RINGBUF), for a thread that blocks.

bcc's `ring_buffer_poll` (libbpf's ring_buffer__poll) blocks in an epoll nobody else can wake,
so a thread waiting there cannot be stopped. This reads the ring directly, as libbpf does
(kernel/bpf/ringbuf.c's layout): the consumer page (read-write, the consumer position), then
the producer page (the producer position) and the data pages mapped twice in a row, so that
a record that wraps around the end reads as one piece. Every record starts with an 8-byte
header: its length, with the BUSY bit while the producer still writes it and the DISCARD bit
if it gave it up, then the record, padded to 8 bytes.

`wait()` blocks in epoll on the ring's fd and an eventfd that `wake()` signals.
"""

from __future__ import annotations

import mmap
import os
import select
import struct

BUSY = 1 << 31
DISCARD = 1 << 30
HEADER = 8


class RingBuffer:
    def __init__(self, map_fd: int, size: int):
        if size <= 0 or size & (size - 1) or size % mmap.PAGESIZE:
            raise ValueError(f"ring buffer size {size}: not a power-of-two multiple of a page")
        page = mmap.PAGESIZE
        self.size = size
        self.mask = size - 1
        self.page = page
        self._cons = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._prod = mmap.mmap(
            map_fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
        )
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep = select.epoll()
        self._ep.register(map_fd, select.EPOLLIN)
        self._ep.register(self._wake, select.EPOLLIN)

    def read(self) -> list[bytes]:
        """Every record committed so far (and frees their space)."""
        cons = struct.unpack_from("<Q", self._cons, 0)[0]
        prod = struct.unpack_from("<Q", self._prod, 0)[0]
        out: list[bytes] = []
        while cons < prod:
            off = self.page + (cons & self.mask)
            word = struct.unpack_from("<I", self._prod, off)[0]
            if word & BUSY:
                break  # still being written: the records after it wait for it
            n = word & ~(BUSY | DISCARD)
            if not word & DISCARD:
                out.append(self._prod[off + HEADER : off + HEADER + n])
            cons += (n + HEADER + 7) & ~7
            struct.pack_into("<Q", self._cons, 0, cons)
        return out

    def wait(self, timeout_s: float | None = None) -> list[bytes]:
        """The records there are; if none, block until some come, `wake()` is called or
        `timeout_s` passes (None: no timeout)."""
        out = self.read()
        if out:
            return out
        for fd, _ in self._ep.poll(-1 if timeout_s is None else timeout_s):
            if fd == self._wake:
                try:
                    os.eventfd_read(self._wake)
                except BlockingIOError:
                    pass
        return self.read()

    def wake(self) -> None:
        """Make a `wait()` in another thread return now."""
        os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        self._ep.close()
        os.close(self._wake)
        self._prod.close()
        self._cons.close()
