"""Faults to inject: what each one is, how it is written (a CLI line or a YAML list), and what
it sets on the switches' traffic managers (one mechanism for the emulation and the twin).

A fault names its target and its kind:

    link leaf1:3 down | up | loss 1% | rate 25% | delay 2ms      (a link, by one of its ends)
    link leaf1:3 silent-loss 0.3% | silent-rate 70% | flap 50ms 10
    switch spine1 kill | slow [DELAY] | up
    nic h3 rate 50% | down | loss 1% | silent-loss 1% | up

A file (`xingmai-testbed run --faults FILE`) is a YAML list of the same, timed from the start
of each scenario:

    - {at: 1.0, target: leaf1:3, kind: loss, value: 1%}
    - {at: 3.0, target: leaf1:3, kind: up}
    - {at: 1.0, target: spine1, kind: slow, value: 5ms}
    - {at: 1.0, target: leaf1:3, kind: flap, value: 50ms, count: 10}

The gray failures: `silent-loss` and `silent-rate` are `loss` and `rate` that no counter of
the switch records (a bad buffer, a misbehaving optic: lost frames are not receive errors, the
port's latency monitor expects its degraded rate), which only the end hosts' signals can find;
`flap` takes the link down for half of every period and up for the other half, `count` times
(each down and up is injected, and recorded, as a fault of its own: `expand`).

A link fault acts on both directions: the ports at both ends that are switch ports get the same
setting (a host's own NIC has no traffic manager: on a host link only the switch's side is
set). A NIC fault acts on the NIC's side: `rate` is its port sending at that fraction of its
line rate (the engine's NIC, its rate laws unaware); `down` takes its links down (the switch
ports they reach see them down) and `loss`/`silent-loss` loses what it sends (the frames arrive
corrupted at those switch ports, which count them as receive errors, or not when silent): the
same port settings as the link's, on every NIC of the host. `slow` delays every frame on every
port of the switch; `kill` ends the switch's process (the emulation) or takes all of its ports
down (the twin). A fault is removed by `up` on the same target; every fault is removed at the
end of each scenario.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.topo import End, FabricSpec

LINK_KINDS = ("down", "up", "loss", "rate", "delay", "silent-loss", "silent-rate", "flap")
PERCENT_KINDS = ("loss", "rate", "silent-loss", "silent-rate")  # values: fractions
TIMED_KINDS = ("delay", "slow", "flap")  # values: seconds
MAX_FLAPS = 10_000
SWITCH_KINDS = ("kill", "slow", "up")
NIC_KINDS = ("rate", "down", "loss", "silent-loss", "up")
DEFAULT_SLOW_S = 0.005  # a slow switch's added delay per frame when none is given


class FaultError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    target: str  # leaf1:3 (a link), spine1 (a switch), h3 (a host's NIC)
    kind: str
    value: float | None = None  # loss: probability; rate: fraction; delay, slow, flap: seconds
    at: float = 0.0  # seconds from the start of the scenario
    count: int = 0  # flap: how many times the link goes down (and up)

    def describe(self) -> str:
        v = ""
        if self.value is not None:
            v = (
                f" {self.value * 1e3:g}ms"
                if self.kind in TIMED_KINDS
                else f" {self.value * 100:g}%"
            )
        if self.kind == "flap":
            v += f" {self.count}"
        return f"{self.target} {self.kind}{v}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Fault:
        """A fault as `to_dict` wrote it (results.json's `faults`; other keys ignored)."""
        return Fault(d["target"], d["kind"], d.get("value"), d.get("at", 0.0), d.get("count", 0))


@dataclass(frozen=True)
class PortSetting:
    """What one fault sets on one switch port (port None: every port); None keeps a value."""

    switch: str
    port: int | None
    down: bool | None = None
    loss: float | None = None
    delay_ns: int | None = None
    rate_factor: float | None = None
    silent: bool | None = None


def healthy(switch: str, port: int | None) -> PortSetting:
    """A port (port None: every port) without any fault."""
    return PortSetting(
        switch, port, down=False, loss=0.0, delay_ns=0, rate_factor=1.0, silent=False
    )


_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*%\s*$")
_SECONDS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(us|ms|s)\s*$")


def parse_seconds(text: str) -> float:
    """A time like `2ms`, `20us` or `1.5s`, in seconds."""
    m = _SECONDS.match(text)
    if m is None:
        raise FaultError(f"expected a time like 2ms or 20us, got {text!r}")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def parse_value(kind: str, raw: Any) -> float | None:
    """A fault's value in its unit: a fraction for loss and rate (`1%`, `0.01`), seconds for
    delay and slow (`2ms`, `0.002`)."""
    if kind in ("down", "up", "kill"):
        if raw is not None:
            raise FaultError(f"{kind} takes no value, got {raw!r}")
        return None
    if raw is None:
        if kind == "slow":
            return DEFAULT_SLOW_S
        raise FaultError(f"{kind} needs a value ({'2ms' if kind in TIMED_KINDS else '25%'})")
    if isinstance(raw, bool):
        raise FaultError(f"{kind}: expected a number, got {raw!r}")
    if isinstance(raw, int | float):
        v = float(raw)
    else:
        text = str(raw)
        if kind in PERCENT_KINDS:
            m = _PERCENT.match(text)
            if m is None:
                raise FaultError(f"{kind}: expected a percentage like 1%, got {text!r}")
            v = float(m.group(1)) / 100
        else:
            try:
                v = parse_seconds(text)
            except FaultError as exc:
                raise FaultError(f"{kind}: {exc}") from None
    if kind in ("loss", "silent-loss") and not 0.0 <= v <= 1.0:
        raise FaultError(f"loss must be within 0 and 100 %, got {v * 100:g} %")
    if kind in ("rate", "silent-rate") and not 0.001 <= v <= 1.0:
        raise FaultError(f"rate must be within 0.1 and 100 % of the port's, got {v * 100:g} %")
    if kind == "flap" and not 1e-6 <= v <= 10.0:
        raise FaultError(f"a flap's period must be within 1 us and 10 s, got {v:g} s")
    if kind in ("delay", "slow") and not 0.0 <= v <= 10.0:
        raise FaultError(f"{kind} must be within 0 and 10 s, got {v:g} s")
    return v


def target_class(spec: FabricSpec, target: str) -> str:
    """link, switch or nic; FaultError when the fabric has no such element."""
    if ":" in target:
        node, _, idx = target.partition(":")
        if not idx.isdigit():
            raise FaultError(f"{target}: a link is named SWITCH:PORT or HOST:NIC")
        end = End(node, int(idx))
        if spec.peer(end) is None:
            raise FaultError(f"{target}: no link at that end in {spec.name}")
        return "link"
    if spec.is_switch(target):
        return "switch"
    if any(h.name == target for h in spec.hosts):
        return "nic"
    raise FaultError(f"{target}: no such switch, host or link end in {spec.name}")


def _check_kind(spec: FabricSpec, target: str, kind: str) -> None:
    cls = target_class(spec, target)
    kinds = {"link": LINK_KINDS, "switch": SWITCH_KINDS, "nic": NIC_KINDS}[cls]
    if kind not in kinds:
        raise FaultError(f"{target}: a {cls} fault is one of {', '.join(kinds)}, not {kind!r}")


def check(spec: FabricSpec, f: Fault) -> None:
    _check_kind(spec, f.target, f.kind)
    if not 0.0 <= f.at < 1e6:
        raise FaultError(f"{f.target} {f.kind}: at must be seconds >= 0, got {f.at}")
    if f.kind == "flap" and not 1 <= f.count <= MAX_FLAPS:
        raise FaultError(f"{f.describe()}: a flap's count must be within 1 and {MAX_FLAPS}")
    if f.kind != "flap" and f.count:
        raise FaultError(f"{f.target} {f.kind}: only a flap has a count")


def make(
    spec: FabricSpec,
    target: str,
    kind: str,
    value: Any = None,
    at: float = 0.0,
    count: Any = None,
) -> Fault:
    _check_kind(spec, target, kind)
    n = 0
    if kind == "flap":
        if isinstance(count, bool) or not isinstance(count, int | str) or not str(count).isdigit():
            raise FaultError(f"{target} flap: a count of downs is needed (flap 50ms 10)")
        n = int(count)
    elif count is not None:
        raise FaultError(f"{target} {kind}: only a flap has a count")
    f = Fault(target, kind, parse_value(kind, value), float(at), n)
    check(spec, f)
    return f


def expand(fs: list[Fault]) -> list[Fault]:
    """The faults as injected, in time order: a flap becomes its downs and ups (down for the
    first half of every period, up for the second)."""
    out: list[Fault] = []
    for f in fs:
        if f.kind != "flap":
            out.append(f)
            continue
        assert f.value is not None
        for i in range(f.count):
            t = f.at + i * f.value
            out += [Fault(f.target, "down", None, t), Fault(f.target, "up", None, t + f.value / 2)]
    return sorted(out, key=lambda f: f.at)


def parse_command(spec: FabricSpec, line: str) -> Fault:
    """`link leaf1:3 loss 1%`, `switch spine1 kill`, `nic h3 rate 50%`, `link leaf1:3 flap
    50ms 10` (the CLI's words)."""
    words = line.split()
    if len(words) not in (3, 4, 5) or words[0] not in ("link", "switch", "nic"):
        raise FaultError(
            "usage: fault link SW:PORT down|up|loss P%|rate P%|delay Tms|silent-loss P%|"
            "silent-rate P%|flap Tms N; fault switch SW kill|slow [Tms]|up; "
            "fault nic HOST rate P%|down|loss P%|silent-loss P%|up"
        )
    cls = target_class(spec, words[1])
    if cls != words[0]:
        raise FaultError(f"{words[1]} is a {cls}, not a {words[0]}")
    value = words[3] if len(words) >= 4 else None
    return make(spec, words[1], words[2], value, count=words[4] if len(words) == 5 else None)


def from_doc(spec: FabricSpec, doc: Any) -> list[Fault]:
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise FaultError("a faults file is a YAML list of {at, target, kind, value}")
    out = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict):
            raise FaultError(f"faults[{i}]: expected a mapping, got {item!r}")
        unknown = set(item) - {"at", "target", "kind", "value", "count"}
        if unknown or "target" not in item or "kind" not in item:
            raise FaultError(
                f"faults[{i}]: keys are at, target, kind, value, count "
                f"(target and kind required), got {sorted(item)}"
            )
        at = item.get("at", 0.0)
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise FaultError(f"faults[{i}].at: expected seconds, got {at!r}")
        try:
            out.append(
                make(
                    spec,
                    str(item["target"]),
                    str(item["kind"]),
                    item.get("value"),
                    float(at),
                    item.get("count"),
                )
            )
        except FaultError as exc:
            raise FaultError(f"faults[{i}]: {exc}") from None
    return sorted(out, key=lambda f: f.at)


def load(spec: FabricSpec, path: str | Path) -> list[Fault]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FaultError(f"{path}: {exc}") from None
    try:
        return from_doc(spec, doc)
    except FaultError as exc:
        raise FaultError(f"{path}: {exc}") from None


def _link_ends(spec: FabricSpec, target: str) -> list[tuple[str, int]]:
    node, _, idx = target.partition(":")
    end = End(node, int(idx))
    peer = spec.peer(end)
    assert peer is not None
    return [(e.node, e.index) for e in (end, peer) if spec.is_switch(e.node)]


def port_settings(spec: FabricSpec, f: Fault) -> list[PortSetting]:
    """What the fault sets on the switches' traffic managers (kill and a NIC's rate: nothing
    here, the engine acts on the process or the NIC)."""
    cls = target_class(spec, f.target)
    if cls == "link":
        ends = _link_ends(spec, f.target)
        if f.kind == "up":
            return [healthy(sw, p) for sw, p in ends]
        if f.kind == "down":
            return [PortSetting(sw, p, down=True) for sw, p in ends]
        assert f.value is not None
        silent = f.kind.startswith("silent-")
        if f.kind in ("loss", "silent-loss"):
            return [PortSetting(sw, p, loss=f.value, silent=silent) for sw, p in ends]
        if f.kind in ("rate", "silent-rate"):
            return [PortSetting(sw, p, rate_factor=f.value, silent=silent) for sw, p in ends]
        if f.kind == "flap":
            raise FaultError(
                f"{f.describe()}: a flap is timed: give it in a faults file (--faults)"
            )
        return [PortSetting(sw, p, delay_ns=round(f.value * 1e9)) for sw, p in ends]
    if cls == "nic":
        nics = range(len(spec.host(f.target).nics))
        reached = [(e.node, e.index) for e in (spec.attachment(f.target, i) for i in nics)]
        if f.kind == "up":
            return [healthy(sw, p) for sw, p in reached]
        if f.kind == "down":
            return [PortSetting(sw, p, down=True) for sw, p in reached]
        if f.kind in ("loss", "silent-loss"):
            silent = f.kind == "silent-loss"
            return [PortSetting(sw, p, loss=f.value, silent=silent) for sw, p in reached]
        return []  # rate: the NIC's own port, not a switch's
    if cls == "switch":
        if f.kind == "slow":
            assert f.value is not None
            return [PortSetting(f.target, None, delay_ns=round(f.value * 1e9))]
        if f.kind == "up":
            return [healthy(f.target, None)]
    return []


def heal_all(spec: FabricSpec) -> list[PortSetting]:
    """Every switch port back to healthy (the end of a scenario)."""
    return [healthy(s.name, None) for s in spec.switches]


def request_fields(ps: PortSetting) -> dict[str, Any]:
    """The SetFaultRequest fields (controller/proto/switch.proto) of a setting."""
    out: dict[str, Any] = {"port": ps.port or 0, "all_ports": ps.port is None}
    for k in ("down", "loss", "delay_ns", "rate_factor", "silent"):
        v = getattr(ps, k)
        if v is not None:
            out[k] = v
    return out
