"""SetForwardingPipelineConfig / GetForwardingPipelineConfig.

A new program is parsed and compiled with no lock held (compiling a large or hostile JSON
takes long and must not stop the packets), under a lock of its own so that two pipeline
changes do not interleave; only the swap takes the switch's lock.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING

from finsy.proto import p4i, p4r

from testbed.switch.p4info import P4InfoError, P4InfoIndex
from testbed.switch.p4runtime.codec import RpcError
from testbed.switch.program import LoadError

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService

log = logging.getLogger("xingmai.switch.p4runtime")

A = p4r.SetForwardingPipelineConfigRequest
R = p4r.GetForwardingPipelineConfigRequest
# What a malformed program can raise while it is parsed or compiled: each is a bad config.
_BAD_PROGRAM = (
    LoadError,
    P4InfoError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    UnicodeDecodeError,
    RecursionError,
    SyntaxError,
)


class Pipeline:
    def __init__(self, svc: P4RuntimeService):
        self.svc = svc
        self.lock = threading.Lock()
        self.saved: tuple[p4i.P4Info, bytes, int] | None = None

    def set(self, request: p4r.SetForwardingPipelineConfigRequest) -> None:
        svc = self.svc
        svc.streams.check_primary(request.device_id, request.election_id, request.role)
        with self.lock:
            action = request.action
            cfg = request.config
            if action == A.COMMIT:
                if self.saved is None:
                    raise RpcError("FAILED_PRECONDITION", "COMMIT without a saved config")
                info, device_config, cookie = self.saved
                self.install(info, device_config, cookie)
                self.saved = None
                return
            if action not in (
                A.VERIFY,
                A.VERIFY_AND_SAVE,
                A.VERIFY_AND_COMMIT,
                A.RECONCILE_AND_COMMIT,
            ):
                raise RpcError("INVALID_ARGUMENT", f"unsupported action {action}")
            if not cfg.p4_device_config:
                raise RpcError("INVALID_ARGUMENT", "the config has no p4_device_config (bmv2 JSON)")
            cookie = cfg.cookie.cookie if cfg.HasField("cookie") else 0
            if (
                action == A.RECONCILE_AND_COMMIT
                and svc.index is not None
                and svc.switch.json_bytes == cfg.p4_device_config
                and svc.p4info == cfg.p4info
            ):
                svc.cookie = cookie  # same program: keep every entry (a restarted controller)
                return
            self.verify(cfg.p4info, cfg.p4_device_config)
            if action in (A.VERIFY_AND_COMMIT, A.RECONCILE_AND_COMMIT):
                self.install(cfg.p4info, cfg.p4_device_config, cookie)
            elif action == A.VERIFY_AND_SAVE:
                self.saved = (cfg.p4info, cfg.p4_device_config, cookie)

    @staticmethod
    def verify(info: p4i.P4Info, device_config: bytes) -> None:
        from testbed.switch.compiler import compile_program
        from testbed.switch.program import Program

        try:
            compiled = compile_program(Program(json.loads(device_config)), lambda: 0)
            P4InfoIndex(info, compiled)
        except _BAD_PROGRAM as exc:
            raise RpcError(
                "INVALID_ARGUMENT", f"bad pipeline config: {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc

    def install(self, info: p4i.P4Info, device_config: bytes, cookie: int) -> None:
        svc = self.svc
        sw = svc.switch
        try:
            sw.load(device_config)  # compiles unlocked, swaps under the switch's lock
            assert sw.compiled is not None
            index = P4InfoIndex(info, sw.compiled)
        except _BAD_PROGRAM as exc:
            raise RpcError(
                "INVALID_ARGUMENT", f"bad pipeline config: {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc
        with sw.lock, svc.lock:
            svc.index = index
            svc.p4info = p4i.P4Info()
            svc.p4info.CopyFrom(info)
            svc.cookie = cookie
            svc.streams.digests.clear()
            svc.initial_defaults = {n: t.default for n, t in sw.compiled.tables.items()}
        log.info("pipeline installed (cookie %#x)", cookie)

    def get(
        self, request: p4r.GetForwardingPipelineConfigRequest
    ) -> p4r.GetForwardingPipelineConfigResponse:
        svc = self.svc
        if request.device_id != svc.device_id:
            raise RpcError("NOT_FOUND", f"device {request.device_id} unknown")
        resp = p4r.GetForwardingPipelineConfigResponse()
        if svc.index is None or svc.p4info is None:
            return resp  # no pipeline yet: an empty config, as PI answers
        rt = request.response_type
        resp.config.cookie.cookie = svc.cookie
        if rt in (R.ALL, R.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(svc.p4info)
        if rt in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = svc.switch.json_bytes
        return resp
