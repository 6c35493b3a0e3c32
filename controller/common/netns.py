"""Network namespaces: enter one for good, or for the making of a socket.

A namespace is named as under /run/netns (what `ip netns add` makes) or given as a path
(/proc/PID/ns/net, a Mininet host's). Only the network namespace changes: the mount namespace
stays the caller's, so bpffs pins stay visible to every other process (unlike `ip netns exec`,
which remounts /sys in a private mount namespace). setns(2) moves the calling thread only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def netns_path(spec: str) -> str:
    """The namespace file of a name under /run/netns, or `spec` itself when it is a path."""
    return spec if "/" in spec else f"/run/netns/{spec}"


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({what}): {os.strerror(err)}")


def enter_netns(spec: str) -> None:
    """Move the calling thread (the process, before it starts threads) into a namespace."""
    path = netns_path(spec)
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns(fd, path)
    finally:
        os.close(fd)


@contextmanager
def in_netns(spec: str) -> Iterator[None]:
    """Run the block with the calling thread in namespace `spec`, then go back.

    A socket made inside stays in that namespace after the block."""
    path = netns_path(spec)
    target = os.open(path, os.O_RDONLY)
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    try:
        _setns(target, path)
        try:
            yield
        finally:
            _setns(home, "the thread's own namespace")
    finally:
        os.close(target)
        os.close(home)
