"""The few bpf(2) commands the agent needs that bcc's Python module does not offer.

Pinning and opening pins, cgroup attach/detach (sock_ops), object info (to check adopted pins
against the header's layouts), BPF_PROG_TEST_RUN (tests drive the programs with crafted
packets) and a map lookup (for a process that reads a pinned map without bcc: the
emulation's transport asks the NIC's `xm_pfc` whether it may send). Raw syscalls through
ctypes: no dependency beyond libc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

SYS_BPF = 321  # x86_64
BPF_MAP_LOOKUP_ELEM = 1
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_TEST_RUN = 10
BPF_OBJ_GET_INFO_BY_FD = 15

BPF_CGROUP_SOCK_OPS = 3
BPF_F_ALLOW_MULTI = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    pass


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    ret = _libc.syscall(
        ctypes.c_long(SYS_BPF),
        ctypes.c_int(cmd),
        ctypes.byref(attr),
        ctypes.c_uint(ctypes.sizeof(attr)),
    )
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"bpf(cmd={cmd}): {os.strerror(err)}")
    return int(ret)


class _ObjAttr(ctypes.Structure):
    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
        ("path_fd", ctypes.c_int32),
        ("_pad", ctypes.c_uint32),
    ]


class _MapElemAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _AttachAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32 * 5),
    ]


class _TestRunAttr(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    ]


class _InfoAttr(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    ]


class _MapInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
        ("_rest", ctypes.c_uint8 * 64),
    ]


def obj_pin(fd: int, path: str) -> None:
    p = ctypes.create_string_buffer(path.encode())
    attr = _ObjAttr(pathname=ctypes.addressof(p), bpf_fd=fd)
    _bpf(BPF_OBJ_PIN, attr)


def obj_get(path: str) -> int:
    """A new fd for a pinned object (the caller closes it)."""
    p = ctypes.create_string_buffer(path.encode())
    attr = _ObjAttr(pathname=ctypes.addressof(p))
    return _bpf(BPF_OBJ_GET, attr)


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes:
    """BPF_MAP_LOOKUP_ELEM: the value of `key` (ENOENT raises BpfError)."""
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value_size)
    _bpf(
        BPF_MAP_LOOKUP_ELEM,
        _MapElemAttr(map_fd=fd, key=ctypes.addressof(k), value=ctypes.addressof(v)),
    )
    return v.raw


def prog_attach(prog_fd: int, target_fd: int, attach_type: int, flags: int = 0) -> None:
    attr = _AttachAttr(
        target_fd=target_fd, attach_bpf_fd=prog_fd, attach_type=attach_type, attach_flags=flags
    )
    _bpf(BPF_PROG_ATTACH, attr)


def prog_detach(prog_fd: int, target_fd: int, attach_type: int) -> None:
    attr = _AttachAttr(target_fd=target_fd, attach_bpf_fd=prog_fd, attach_type=attach_type)
    _bpf(BPF_PROG_DETACH, attr)


@dataclass(frozen=True)
class MapInfo:
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    name: str


def map_info(fd: int) -> MapInfo:
    info = _MapInfo()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return MapInfo(
        info.type,
        info.id,
        info.key_size,
        info.value_size,
        info.max_entries,
        info.name.decode(errors="replace"),
    )


@dataclass(frozen=True)
class TestRun:
    retval: int
    data_out: bytes
    ctx_out: bytes
    duration_ns: int


def prog_test_run(
    prog_fd: int, data: bytes, ctx: bytes | None = None, *, repeat: int = 1, out_size: int = 0
) -> TestRun:
    """BPF_PROG_TEST_RUN: run a program once (or `repeat` times) on `data`."""
    data_in = ctypes.create_string_buffer(data, len(data))
    out_len = out_size or len(data) + 256
    data_out = ctypes.create_string_buffer(out_len)
    attr = _TestRunAttr(
        prog_fd=prog_fd,
        data_size_in=len(data),
        data_size_out=out_len,
        data_in=ctypes.addressof(data_in),
        data_out=ctypes.addressof(data_out),
        repeat=repeat,
    )
    ctx_in = ctx_out = None
    if ctx is not None:
        ctx_in = ctypes.create_string_buffer(ctx, len(ctx))
        ctx_out = ctypes.create_string_buffer(len(ctx))
        attr.ctx_size_in = len(ctx)
        attr.ctx_size_out = len(ctx)
        attr.ctx_in = ctypes.addressof(ctx_in)
        attr.ctx_out = ctypes.addressof(ctx_out)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return TestRun(
        retval=attr.retval,
        data_out=data_out.raw[: attr.data_size_out],
        ctx_out=ctx_out.raw[: attr.ctx_size_out] if ctx_out is not None else b"",
        duration_ns=attr.duration,
    )
