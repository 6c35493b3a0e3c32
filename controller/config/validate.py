"""Read and check the controller's YAML into the dataclasses of controller/config/schema.py.

The testbed writes this file for the network it boots (see `controller/examples/` for a
2-leaf 2-spine fabric). Every error names the bad key by its path, e.g.
`switches[1].ports[0].speed_gbps: expected a number, got 'fast'`, so a generated file that is
wrong says where. Paths in the file are relative to the file's own folder.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from controller.config.schema import (
    INT_MODES,
    RATE_LAW_PARAMS,
    RATE_LAWS,
    SWITCH_KINDS,
    CollectorConfig,
    Config,
    ControllerSection,
    EcnConfig,
    Endpoint,
    HostConfig,
    IntConfig,
    LawPolicy,
    LinkConfig,
    ModelConfig,
    NicConfig,
    PipelineConfig,
    PolicyConfig,
    PortConfig,
    SwitchConfig,
    TlsConfig,
    WatchEntry,
)

T = TypeVar("T")

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the path of the bad key."""


# ---- validation -----------------------------------------------------------------------------


class _Reader:
    """Reads one mapping, remembering which keys were used; unknown keys are errors."""

    def __init__(self, doc: Any, path: str):
        if not isinstance(doc, dict):
            raise ConfigError(f"{path or '<top>'}: expected a mapping, got {_show(doc)}")
        self.doc = doc
        self.path = path
        self.used: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, conv: Callable[[Any, str], T], default: T) -> T:
        self.used.add(key)
        if key not in self.doc or self.doc[key] is None:
            return default
        return conv(self.doc[key], self.sub(key))

    def req(self, key: str, conv: Callable[[Any, str], T]) -> T:
        self.used.add(key)
        if key not in self.doc or self.doc[key] is None:
            raise ConfigError(f"{self.sub(key)}: required")
        return conv(self.doc[key], self.sub(key))

    def done(self) -> None:
        extra = sorted(str(k) for k in self.doc if k not in self.used)
        if extra:
            raise ConfigError(f"{self.sub(extra[0])}: unknown key")


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any, str], int]:
    def conv(v: Any, path: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{path}: expected an integer, got {_show(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ConfigError(f"{path}: {v} out of range [{lo}, {hi}]")
        return v

    return conv


def _num(
    lo: float | None = None, hi: float | None = None, open_lo: bool = False
) -> Callable[[Any, str], float]:
    def conv(v: Any, path: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {_show(v)}")
        x = float(v)
        if (
            x != x
            or (lo is not None and (x < lo or (open_lo and x == lo)))
            or (hi is not None and x > hi)
        ):
            raise ConfigError(f"{path}: {v} out of range {'(' if open_lo else '['}{lo}, {hi}]")
        return x

    return conv


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{path}: expected a non-empty string, got {_show(v)}")
    return v


def _bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{path}: expected true or false, got {_show(v)}")
    return v


def _name(v: Any, path: str) -> str:
    s = _str(v, path)
    if not _NAME_RE.match(s):
        raise ConfigError(f"{path}: {s!r} is not a valid name (letters, digits, _ . -)")
    return s


def _choice(*options: str) -> Callable[[Any, str], str]:
    def conv(v: Any, path: str) -> str:
        if v not in options:
            raise ConfigError(f"{path}: expected one of {', '.join(options)}, got {_show(v)}")
        return str(v)

    return conv


def _addr(v: Any, path: str) -> str:
    """HOST:PORT (a gRPC target or a socket address)."""
    s = _str(v, path)
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{path}: expected HOST:PORT, got {s!r}")
    return s


def _target(v: Any, path: str) -> str:
    """A gRPC target: HOST:PORT, or unix:PATH (a host agent's socket, e.g.
    unix:///run/xingmai/agents/h1/agent.sock)."""
    s = _str(v, path)
    if s.startswith("unix:"):
        if len(s.removeprefix("unix:").lstrip("/")) == 0:
            raise ConfigError(f"{path}: {s!r} names no socket path")
        return s
    return _addr(s, path)


def _ip(v: Any, path: str) -> str:
    try:
        return str(ipaddress.IPv4Address(_str(v, path)))
    except ValueError:
        raise ConfigError(f"{path}: {v!r} is not an IPv4 address") from None


def _prefix(v: Any, path: str) -> str:
    try:
        return str(ipaddress.IPv4Network(_str(v, path), strict=True))
    except ValueError as exc:
        raise ConfigError(f"{path}: {v!r} is not an IPv4 prefix ({exc})") from None


def _mac(v: Any, path: str) -> str:
    s = _str(v, path)
    if not _MAC_RE.match(s):
        raise ConfigError(f"{path}: {s!r} is not a MAC address")
    return s.lower()


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise ConfigError(f"{path}: expected a list, got {_show(v)}")
    return v


class _Paths:
    def __init__(self, base: Path):
        self.base = base

    def __call__(self, v: Any, path: str) -> Path:
        p = Path(_str(v, path)).expanduser()
        return p if p.is_absolute() else (self.base / p)


def _tls(doc: Any, path: str, paths: _Paths) -> TlsConfig:
    r = _Reader(doc, path)
    out = TlsConfig(cert=r.req("cert", paths), key=r.req("key", paths), ca=r.req("ca", paths))
    r.done()
    return out


def _endpoint(v: Any, path: str) -> Endpoint:
    s = _str(v, path)
    node, sep, rest = s.partition(":")
    if not _NAME_RE.match(node):
        raise ConfigError(f"{path}: {s!r} must be SWITCH:PORT, HOST:NIC or collector")
    if not sep:
        return Endpoint(node)
    if rest.isdigit():
        return Endpoint(node, port=int(rest))
    if not rest:
        raise ConfigError(f"{path}: {s!r} has an empty port or NIC")
    return Endpoint(node, nic=rest)


def _law(doc: Any, path: str) -> LawPolicy:
    r = _Reader(doc, path)
    law = r.get("rate_law", _choice(*RATE_LAWS), "tita")
    raw: dict[Any, Any] = r.get("params", lambda v, p: _Reader(v, p).doc, {})
    params = {str(k): _num(0)(v, f"{path}.params.{k}") for k, v in raw.items()}
    r.done()
    for k in params:
        if k not in RATE_LAW_PARAMS[law]:
            raise ConfigError(
                f"{path}.params.{k}: {law} has no such parameter (known: "
                f"{', '.join(sorted(RATE_LAW_PARAMS[law]))})"
            )
    return LawPolicy(law, params)


def _controller(doc: Any, paths: _Paths) -> ControllerSection:
    r = _Reader(doc, "controller")
    d = ControllerSection()
    out = ControllerSection(
        name=r.get("name", _str, d.name),
        grpc_addr=r.get("grpc_addr", _addr, d.grpc_addr),
        metrics_addr=r.get("metrics_addr", _addr, None),
        web_addr=r.get("web_addr", _addr, None),
        election_id=r.get("election_id", _int(1, 2**64 - 1), d.election_id),
        tls=r.get("tls", lambda v, p: _tls(v, p, paths), None),
        p4runtime_tls=r.get("p4runtime_tls", lambda v, p: _tls(v, p, paths), None),
        log_level=r.get(
            "log_level", _choice("trace", "debug", "info", "warn", "error"), d.log_level
        ),
        log_file=r.get("log_file", paths, None),
        counter_poll_s=r.get("counter_poll_s", _num(0.05, 3600), d.counter_poll_s),
        reconnect_max_s=r.get("reconnect_max_s", _num(0.1, 3600), d.reconnect_max_s),
        rpc_timeout_s=r.get("rpc_timeout_s", _num(0.05, 600), d.rpc_timeout_s),
        series_points=r.get("series_points", _int(2, 1_000_000), d.series_points),
        int_latency_monitor=r.get("int_latency_monitor", _bool, d.int_latency_monitor),
        probe_interval_s=r.get("probe_interval_s", _num(0, 3600), d.probe_interval_s),
    )
    r.done()
    return out


def _pipeline(doc: Any, paths: _Paths, path: str = "pipeline") -> PipelineConfig:
    r = _Reader(doc, path)
    out = PipelineConfig(p4info=r.req("p4info", paths), bmv2_json=r.req("bmv2_json", paths))
    r.done()
    return out


def _model(doc: Any) -> ModelConfig:
    r = _Reader(doc, "model")
    d = ModelConfig()
    out = ModelConfig(
        name=r.get("name", _str, d.name),
        port_speed_gbps=r.get("port_speed_gbps", _num(0, None, open_lo=True), d.port_speed_gbps),
        scale=r.get("scale", _num(1, None), d.scale),
        queue_depth_bytes=r.get("queue_depth_bytes", _int(0), d.queue_depth_bytes),
        queue_depth_packets=r.get("queue_depth_packets", _int(1), d.queue_depth_packets),
        shared_buffer_bytes_per_port=r.get(
            "shared_buffer_bytes_per_port", _int(0), d.shared_buffer_bytes_per_port
        ),
        buffer_alpha=r.get("buffer_alpha", _num(0, None, open_lo=True), d.buffer_alpha),
        mean_packet_bytes=r.get("mean_packet_bytes", _int(64, 9216), d.mean_packet_bytes),
        cell_bytes=r.get("cell_bytes", _int(1, 65536), d.cell_bytes),
    )
    r.done()
    return out


def _int_section(doc: Any) -> IntConfig:
    r = _Reader(doc, "int")
    d = IntConfig()
    cr = _Reader(r.get("collector", lambda v, p: v, {}), "int.collector")
    dc = CollectorConfig()
    collector = CollectorConfig(
        listen=cr.get("listen", _addr, None),
        netns=cr.get("netns", _name, None),
        ip=cr.get("ip", _ip, dc.ip),
        mac=cr.get("mac", _mac, dc.mac),
        udp_port=cr.get("udp_port", _int(1, 65535), dc.udp_port),
        clone_session=cr.get("clone_session", _int(1, 65535), dc.clone_session),
        report_src_ip=cr.get("report_src_ip", _ip, dc.report_src_ip),
    )
    cr.done()
    watch = []
    raw_watch = r.get("watchlist", _list, None)
    for i, w in enumerate(raw_watch if raw_watch is not None else []):
        wr = _Reader(w, f"int.watchlist[{i}]")
        watch.append(
            WatchEntry(
                src=wr.get("src", _prefix, "0.0.0.0/0"),
                dst=wr.get("dst", _prefix, "0.0.0.0/0"),
                proto=wr.get("proto", _int(0, 255), None),
                dport=wr.get("dport", _int(0, 65535), None),
            )
        )
        wr.done()
    out = IntConfig(
        dscp=r.get("dscp", _int(0, 63), d.dscp),
        instruction_bitmap=r.get("instruction_bitmap", _int(0, 0xFFFF), d.instruction_bitmap),
        hop_budget=r.get("hop_budget", _int(1, 255), d.hop_budget),
        domain_id=r.get("domain_id", _int(0, 0xFFFF), d.domain_id),
        mtu=r.get("mtu", _int(576, 9216), d.mtu),
        collector=collector,
        watchlist=tuple(watch) if raw_watch is not None else d.watchlist,
    )
    r.done()
    return out


def _ecn(doc: Any) -> EcnConfig:
    r = _Reader(doc, "ecn")
    d = EcnConfig()
    out = EcnConfig(
        kmin_bytes=r.get("kmin_bytes", _int(0), d.kmin_bytes),
        kmax_bytes=r.get("kmax_bytes", _int(0), d.kmax_bytes),
        pmax=r.get("pmax", _num(0, 1), d.pmax),
    )
    r.done()
    if out.kmax_bytes < out.kmin_bytes:
        raise ConfigError(f"ecn.kmax_bytes: {out.kmax_bytes} is below kmin_bytes {out.kmin_bytes}")
    return out


def _switch(doc: Any, path: str, model: ModelConfig, paths: _Paths) -> SwitchConfig:
    r = _Reader(doc, path)
    ports = []
    for i, p in enumerate(r.req("ports", _list)):
        ppath = f"{path}.ports[{i}]"
        if isinstance(p, int) and not isinstance(p, bool):
            p = {"port": p}
        pr = _Reader(p, ppath)
        ports.append(
            PortConfig(
                port=pr.req("port", _int(0, 510)),
                speed_gbps=pr.get("speed_gbps", _num(0, None, open_lo=True), model.port_speed_gbps),
            )
        )
        pr.done()
    seen: set[int] = set()
    for i, pc in enumerate(ports):
        if pc.port in seen:
            raise ConfigError(f"{path}.ports[{i}].port: port {pc.port} listed twice")
        seen.add(pc.port)
    kind = r.get("kind", _choice(*SWITCH_KINDS), "builtin")
    out = SwitchConfig(
        name=r.req("name", _name),
        grpc_addr=r.req("grpc_addr", _addr),
        device_id=r.req("device_id", _int(0, 2**64 - 1)),
        node_id=r.req("node_id", _int(1, 2**32 - 2)),
        router_mac=r.req("router_mac", _mac),
        ports=tuple(ports),
        kind=kind,
        thrift_port=r.get("thrift_port", _int(1, 65535), None),
        cpu_port=r.get("cpu_port", _int(0, 511), 255),
        pipeline=r.get("pipeline", lambda v, p: _pipeline(v, paths, p), None),
    )
    r.done()
    if kind == "bmv2" and out.thrift_port is None:
        raise ConfigError(f"{path}.thrift_port: required for a bmv2 switch (queue rates)")
    return out


def _host(doc: Any, path: str) -> HostConfig:
    r = _Reader(doc, path)
    nics = []
    for i, n in enumerate(r.req("nics", _list)):
        nr = _Reader(n, f"{path}.nics[{i}]")
        nics.append(
            NicConfig(name=nr.req("name", _name), ip=nr.req("ip", _ip), mac=nr.req("mac", _mac))
        )
        nr.done()
    if not nics:
        raise ConfigError(f"{path}.nics: a host needs at least one NIC")
    out = HostConfig(
        name=r.req("name", _name),
        nics=tuple(nics),
        agent=r.get("agent", _target, None),
        int_mode=r.get("int", _choice(*INT_MODES), "nic"),
    )
    r.done()
    return out


def _policy(doc: Any, hosts: set[str]) -> PolicyConfig:
    r = _Reader(doc, "policy")
    d = PolicyConfig()
    raw_hosts: dict[Any, Any] = r.get("hosts", lambda v, p: _Reader(v, p).doc, {})
    per_host = {}
    for name, v in raw_hosts.items():
        if name not in hosts:
            raise ConfigError(f"policy.hosts.{name}: no such host")
        per_host[str(name)] = _law(v, f"policy.hosts.{name}")
    out = PolicyConfig(
        interval_s=r.get("interval_s", _num(0.01, 3600), d.interval_s),
        eta=r.get("eta", _num(0, 1, open_lo=True), d.eta),
        flow_idle_s=r.get("flow_idle_s", _num(0.01, 3600), d.flow_idle_s),
        default=r.get("default", _law, d.default),
        hosts=per_host,
        auto_tune=r.get("auto_tune", _bool, d.auto_tune),
        push_caps=r.get("push_caps", _bool, d.push_caps),
    )
    r.done()
    return out


def _check_graph(
    cfg_switches: list[SwitchConfig], cfg_hosts: list[HostConfig], links: list[LinkConfig]
) -> None:
    """Names unique, link ends exist, every switch port and NIC in at most one link."""
    names: set[str] = set()
    all_names = [(f"switches[{i}]", s.name) for i, s in enumerate(cfg_switches)] + [
        (f"hosts[{i}]", h.name) for i, h in enumerate(cfg_hosts)
    ]
    for where, name in all_names:
        if name in names or name == "collector":
            raise ConfigError(f"{where}.name: {name!r} is used twice (or reserved)")
        names.add(name)
    for key in ("device_id", "node_id"):
        seen: dict[int, int] = {}
        for i, s in enumerate(cfg_switches):
            v = getattr(s, key)
            if v in seen:
                raise ConfigError(
                    f"switches[{i}].{key}: {v} already used by {cfg_switches[seen[v]].name}"
                )
            seen[v] = i
    ips: set[str] = set()
    for i, h in enumerate(cfg_hosts):
        for j, n in enumerate(h.nics):
            if n.ip in ips:
                raise ConfigError(f"hosts[{i}].nics[{j}].ip: {n.ip} used twice")
            ips.add(n.ip)
    sw = {s.name: s for s in cfg_switches}
    hs = {h.name: h for h in cfg_hosts}
    used: dict[str, str] = {}
    for i, link in enumerate(links):
        for side, ep in (("a", link.a), ("b", link.b)):
            path = f"links[{i}].{side}"
            if ep.node == "collector":
                if ep.port is not None or ep.nic is not None:
                    raise ConfigError(f"{path}: the collector end is written 'collector'")
            elif ep.node in sw:
                if ep.port is None:
                    raise ConfigError(f"{path}: {ep} must be SWITCH:PORT")
                if sw[ep.node].port(ep.port) is None:
                    raise ConfigError(
                        f"{path}: switch {ep.node} has no port {ep.port} in its ports list"
                    )
            elif ep.node in hs:
                if ep.nic is None or all(n.name != ep.nic for n in hs[ep.node].nics):
                    raise ConfigError(f"{path}: host {ep.node} has no NIC {ep.nic!r}")
            else:
                raise ConfigError(f"{path}: no switch or host named {ep.node!r}")
            if str(ep) in used:
                raise ConfigError(f"{path}: {ep} is already linked ({used[str(ep)]})")
            used[str(ep)] = f"links[{i}]"
        if link.a.node not in sw and link.b.node not in sw:
            raise ConfigError(f"links[{i}]: a link needs a switch at one end at least")
    for h in cfg_hosts:
        for n in h.nics:
            if f"{h.name}:{n.name}" not in used:
                raise ConfigError(f"links: host {h.name} NIC {n.name} is not linked to a switch")


def parse(doc: Any, base: Path = Path("."), source: Path | None = None) -> Config:
    """Validate a loaded YAML document into a Config (ConfigError naming the bad key)."""
    paths = _Paths(base)
    top = _Reader(doc, "")
    controller = top.get("controller", lambda v, p: _controller(v, paths), ControllerSection())
    pipeline = top.req("pipeline", lambda v, p: _pipeline(v, paths))
    model = top.get("model", lambda v, p: _model(v), ModelConfig())
    int_cfg = top.get("int", lambda v, p: _int_section(v), IntConfig())
    ecn = top.get("ecn", lambda v, p: _ecn(v), EcnConfig())
    switches = [
        _switch(s, f"switches[{i}]", model, paths) for i, s in enumerate(top.req("switches", _list))
    ]
    if not switches:
        raise ConfigError("switches: at least one switch is needed")
    raw_hosts: list[Any] = top.get("hosts", _list, [])
    hosts = [_host(h, f"hosts[{i}]") for i, h in enumerate(raw_hosts)]
    links = []
    raw_links: list[Any] = top.get("links", _list, [])
    for i, raw in enumerate(raw_links):
        path = f"links[{i}]"
        if not isinstance(raw, list) or len(raw) != 2:
            raise ConfigError(f"{path}: expected [END, END], got {_show(raw)}")
        links.append(LinkConfig(_endpoint(raw[0], f"{path}.a"), _endpoint(raw[1], f"{path}.b")))
    policy = top.get("policy", lambda v, p: _policy(v, {h.name for h in hosts}), PolicyConfig())
    top.done()
    _check_graph(switches, hosts, links)

    return Config(
        controller=controller,
        pipeline=pipeline,
        model=model,
        int=int_cfg,
        ecn=ecn,
        switches=tuple(switches),
        hosts=tuple(hosts),
        links=tuple(links),
        policy=policy,
        source=source,
    )


def load(path: str | Path) -> Config:
    """Read and validate a config file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    try:
        return parse(doc, p.resolve().parent, p)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
