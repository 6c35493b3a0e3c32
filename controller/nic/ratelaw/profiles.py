"""Named CC profiles: each rate law's parameters as a source ships or publishes them.

A profile is a YAML file in `profiles/` (package data): its name, its law, its source (title,
vendor or authors, year, section, URL) and every field of the law's struct
(`params.DcqcnParams`, `TitaParams`, `TimelyParams`, `SwiftParams`, and `min_rate_bps`), each
as `value` + `unit` as the source gives it, with `from:` (what the source says) or `chosen:`
(a value the source does not give: which one and why). `not_modelled:` lists the source's
parameters that no field of ours carries, and why. A DCQCN profile also gives its notification
point's (the receiving NIC's) `cnp_interval_ns`, the least time between two CNPs of a flow:
not the law's (XDP never reads it) but the transport's (`Profile.np_values`).

`Profile.cc_params(line_rate_bps, base_rtt_ns, dilation)` turns it into CcParams for a NIC:

- units convert to the field's (b/s, ns, bytes, a fraction, a count): `Mb/s` x 1e6, `us` x
  1000, `percent` / 100, NVIDIA's `dce_tcp_g` (10-bit fixed point: on a CNP alpha becomes
  (G/1024) alpha + (1 - G/1024), so the paper's g = (1024 - G) / 1024), `line` (a fraction of
  the line rate), `T` (multiples of the base RTT), `packets` (the testbed's full frame,
  SWIFT_MTU_BYTES), `rai` (multiples of this profile's rai_bps);
- `per: <rate>` says the source ties the value to that line rate (a paper's NICs): rates
  scale by s = line rate / per, times by 1 / s (the old `DcqcnParams.scaled`);
- values without `per` are what a real NIC at the model's speed uses (a vendor's firmware
  defaults, the same at every speed): the testbed runs the model `dilation` times slower
  (the scale: model speed / emulated speed), so rates divide by it and times multiply by it;
  bytes and counts stay.

Rates and times a scaling leaves below 1 become 1 (0 stays 0: "off"). A time the dilation
takes past the NIC's 32-bit ns fields (4.29 s; e.g. NVIDIA's 300 us rate timer at the
emulation's scale of 20,000 is 6 s) becomes 2**32 - 1 ns, and `Profile.clamped()` says which:
the suite prints it and results.json records it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from controller.nic.ratelaw.base import UNIT, Law, from_fixed, to_fixed
from controller.nic.ratelaw.params import (
    SWIFT_MTU_BYTES,
    CcParams,
    DcqcnParams,
    SwiftParams,
    TimelyParams,
    TitaParams,
)

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"

# The profile each law runs unless told otherwise. DCQCN: NVIDIA's ConnectX firmware defaults
# (what a RoCE fabric runs), not the paper's 40 Gb/s values dilated by the line rate.
DEFAULT_PROFILES: dict[Law, str] = {
    Law.NONE: "none",
    Law.TITA: "tita",
    Law.DCQCN: "dcqcn-nvidia",
    Law.HPCC: "hpcc-paper",
    Law.TIMELY: "timely-paper",
    Law.SWIFT: "swift-paper",
}

# The struct of each law (the CcParams attribute holding it); NONE has none.
LAW_STRUCT: dict[Law, tuple[str, type] | None] = {
    Law.NONE: None,
    Law.TITA: ("tita", TitaParams),
    Law.DCQCN: ("dcqcn", DcqcnParams),
    Law.HPCC: ("hpcc", TitaParams),
    Law.TIMELY: ("timely", TimelyParams),
    Law.SWIFT: ("swift", SwiftParams),
}

# The notification point's fields of a law's profile: the receiving NIC's, which the transport
# (not the rate law's struct) takes.
NP_FIELDS: dict[Law, tuple[str, ...]] = {Law.DCQCN: ("cnp_interval_ns",)}

# What each field measures. Fractions are UNIT fixed point in the struct.
RATE, TIME, BYTES, FRACTION, COUNT = "rate", "time", "bytes", "fraction", "count"
FIELD_KIND: dict[str, str] = {
    "min_rate_bps": RATE,
    "wai_bps": RATE,
    "rai_bps": RATE,
    "rhai_bps": RATE,
    "delta_bps": RATE,
    "base_rtt_ns": TIME,
    "alpha_timer_ns": TIME,
    "rate_timer_ns": TIME,
    "cut_interval_ns": TIME,
    "t_low_ns": TIME,
    "t_high_ns": TIME,
    "min_rtt_ns": TIME,
    "base_target_ns": TIME,
    "per_hop_ns": TIME,
    "cnp_interval_ns": TIME,
    "byte_counter": BYTES,
    "ai_bytes": BYTES,
    "eta": FRACTION,
    "g": FRACTION,
    "alpha": FRACTION,
    "beta": FRACTION,
    "max_mdf": FRACTION,
    "max_stage": COUNT,
    "fast_recovery_steps": COUNT,
    "clamp_target": COUNT,
    "hai_steps": COUNT,
    "sender_ttl": COUNT,
}

# Physical units: the factor to the field's unit (b/s, ns, bytes, fraction, count).
UNITS: dict[str, dict[str, Fraction]] = {
    RATE: {
        "b/s": Fraction(1),
        "kb/s": Fraction(10**3),
        "Mb/s": Fraction(10**6),
        "Gb/s": Fraction(10**9),
    },
    TIME: {"ns": Fraction(1), "us": Fraction(10**3), "ms": Fraction(10**6), "s": Fraction(10**9)},
    BYTES: {
        "B": Fraction(1),
        "KiB": Fraction(1024),
        "MiB": Fraction(1 << 20),
        "packets": Fraction(SWIFT_MTU_BYTES),
    },
    FRACTION: {"fraction": Fraction(1), "percent": Fraction(1, 100)},
    COUNT: {"count": Fraction(1)},
}
# Units relative to the NIC or the profile: no dilation, no `per`.
RELATIVE_UNITS: dict[str, str] = {"line": RATE, "rai": RATE, "T": TIME, "dce_tcp_g": FRACTION}
DCE_TCP_G_ONE = 1024  # NVIDIA's DCE_TCP_G: alpha's weight in 10-bit fixed point
SOURCE_KEYS = ("title", "by", "year", "section", "url")
U32 = 2**32
NS_MAX = U32 - 1  # the NIC's time fields are 32 bits of ns


class ProfileError(ValueError):
    """A profile that does not exist or does not validate; the message says which and why."""


@dataclass(frozen=True)
class Param:
    field: str
    value: Fraction  # as the source gives it, in `unit`
    unit: str
    per_bps: Fraction | None  # the line rate the source ties the value to
    origin: str  # the source's words (`from:`) or our reason (`chosen:`)
    chosen: bool  # True: the source does not give it


@dataclass(frozen=True)
class Profile:
    name: str
    law: Law
    summary: str
    source: dict[str, Any]
    params: dict[str, Param]
    not_modelled: dict[str, str]

    def cc_params(self, line_rate_bps: int, base_rtt_ns: int, dilation: float = 1.0) -> CcParams:
        """CcParams for a NIC at `line_rate_bps` with base RTT T = `base_rtt_ns`, the model
        running `dilation` times slower than the NIC it stands for. The other laws' structs
        keep CcParams.defaults (the law reads only its own struct and min_rate_bps)."""
        if not dilation >= 1:
            raise ProfileError(f"cc profile {self.name!r}: dilation {dilation} must be >= 1")
        if line_rate_bps <= 0 or base_rtt_ns <= 0:
            raise ProfileError(f"cc profile {self.name!r}: line rate and base RTT must be > 0")
        out = {
            k: min(v, NS_MAX) if FIELD_KIND[k] == TIME else v
            for k, v in self._values(line_rate_bps, base_rtt_ns, dilation).items()
        }
        for f in NP_FIELDS.get(self.law, ()):
            out.pop(f)
        base = CcParams.defaults(self.law, line_rate_bps, base_rtt_ns)
        p = replace(base, min_rate_bps=out.pop("min_rate_bps"))
        struct = LAW_STRUCT[self.law]
        if struct is not None:
            attr, cls = struct
            p = replace(p, **{attr: cls(**out)})
        try:
            p.validate(line_rate_bps)
        except ValueError as exc:
            raise ProfileError(f"cc profile {self.name!r} at {line_rate_bps} b/s: {exc}") from None
        return p

    def np_values(
        self, line_rate_bps: int, base_rtt_ns: int, dilation: float = 1.0
    ) -> dict[str, int]:
        """The notification point's fields (NP_FIELDS) for a NIC at `line_rate_bps`, as
        cc_params() converts the law's ({} for a law that has none)."""
        conv = self._convert
        return {
            f: min(conv(self.params[f], line_rate_bps, base_rtt_ns, dilation, None), NS_MAX)
            for f in NP_FIELDS.get(self.law, ())
        }

    def clamped(
        self, line_rate_bps: int, base_rtt_ns: int, dilation: float = 1.0
    ) -> dict[str, int]:
        """The times cc_params() clamped to 2**32 - 1 ns, with the values they had."""
        return {
            k: v
            for k, v in self._values(line_rate_bps, base_rtt_ns, dilation).items()
            if FIELD_KIND[k] == TIME and v > NS_MAX
        }

    def _values(self, line_rate_bps: int, base_rtt_ns: int, dilation: float) -> dict[str, int]:
        out: dict[str, int] = {}
        # rai first: rhai may be given in multiples of it
        for name in sorted(self.params, key=lambda n: n != "rai_bps"):
            out[name] = self._convert(
                self.params[name], line_rate_bps, base_rtt_ns, dilation, out.get("rai_bps")
            )
        return out

    def _convert(
        self, prm: Param, line_rate_bps: int, base_rtt_ns: int, dilation: float, rai_bps: int | None
    ) -> int:
        kind, v = FIELD_KIND[prm.field], prm.value
        if prm.unit == "line":
            return math.floor(v * line_rate_bps)
        if prm.unit == "T":
            return math.floor(v * base_rtt_ns)
        if prm.unit == "rai":
            assert rai_bps is not None  # checked when loaded
            return math.floor(v * rai_bps)
        if prm.unit == "dce_tcp_g":
            return to_fixed(float((DCE_TCP_G_ONE - v) / DCE_TCP_G_ONE))
        x = v * UNITS[kind][prm.unit]
        if kind == FRACTION:
            return to_fixed(float(x))
        if kind in (BYTES, COUNT) or x == 0:
            return int(x)
        if prm.per_bps is not None:
            # the old DcqcnParams.scaled / TimelyParams.scaled, operation for operation
            s = line_rate_bps / float(prm.per_bps)
            y = float(x) * s if kind == RATE else float(x) / s
        else:
            y = float(x) / dilation if kind == RATE else float(x) * dilation
        return max(1, int(y))

    def with_values(self, settings: dict[str, str]) -> Profile:
        """This profile with some parameters set otherwise (`--cc-set`, the tuner's
        candidates): each `FIELD: "VALUE [UNIT]"`, in the profile's unit (and its `per`) when
        no unit is given. The name says what was set (`tita[eta=0.9]`); the source stays
        the profile's, each parameter set says it was chosen. A ProfileError names a field
        the law does not have or a value it cannot take."""
        if not settings:
            return self

        def bad(msg: str) -> ProfileError:
            return ProfileError(f"cc profile {self.name!r}: {msg}")

        params = dict(self.params)
        for name in sorted(settings):
            text = str(settings[name]).split()
            if name not in params:
                raise bad(f"no parameter {name!r} (its parameters: {', '.join(sorted(params))})")
            if len(text) not in (1, 2):
                raise bad(f"{name}: {settings[name]!r} is not 'VALUE [UNIT]'")
            try:
                value = float(text[0])
            except ValueError:
                raise bad(f"{name}: {text[0]!r} is not a number") from None
            old = params[name]
            entry: dict[str, Any] = {
                "value": value,
                "unit": text[1] if len(text) == 2 else old.unit,
                "chosen": f"set to {' '.join(text)} (the profile: {float(old.value):g} {old.unit})",
            }
            if len(text) == 1 and old.per_bps is not None:
                entry["per"] = f"{old.per_bps} b/s"
            params[name] = _parse_param(name, entry, bad)
        label = ",".join(f"{k}={' '.join(str(settings[k]).split())}" for k in sorted(settings))
        return replace(self, name=f"{self.name}[{label}]", params=params)

    def record(
        self,
        params: CcParams,
        clamped: dict[str, int] | None = None,
        np_values: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """For results.json: the profile, its source, the values `params` holds (the
        struct's fields in b/s, ns, bytes, fractions and counts), the notification point's
        (`np_values`) and what was clamped."""
        values: dict[str, float] = {"min_rate_bps": params.min_rate_bps, **(np_values or {})}
        struct = LAW_STRUCT[self.law]
        if struct is not None:
            s = getattr(params, struct[0])
            for f in fields(s):
                v = getattr(s, f.name)
                values[f.name] = from_fixed(v) if FIELD_KIND[f.name] == FRACTION else v
        return {
            "profile": self.name,
            "law": self.law.name.lower(),
            "source": self.source,
            "values": values,
            "clamped_from": clamped or {},
        }


def policy_params(p: CcParams) -> dict[str, float]:
    """Every parameter of `p`'s law as the host agent names them (controller/proto/
    agent.proto: what the controller's SetPolicy carries to the agents)."""
    out: dict[str, float] = {"min_rate_bps": p.min_rate_bps}
    if p.law in (Law.TITA, Law.HPCC):
        t = p.hpcc if p.law is Law.HPCC else p.tita
        out |= {
            "eta": from_fixed(t.eta),
            "w_ai_bps": t.wai_bps,
            "max_stage": t.max_stage,
            "base_rtt_ns": t.base_rtt_ns,
        }
    elif p.law is Law.DCQCN:
        d = p.dcqcn
        out |= {
            "g": from_fixed(d.g),
            "rai_bps": d.rai_bps,
            "rhai_bps": d.rhai_bps,
            "byte_counter_bytes": d.byte_counter,
            "alpha_timer_ns": d.alpha_timer_ns,
            "rate_timer_ns": d.rate_timer_ns,
            "cut_interval_ns": d.cut_interval_ns,
            "fast_recovery_steps": d.fast_recovery_steps,
            "clamp_target": d.clamp_target,
        }
    elif p.law is Law.TIMELY:
        m = p.timely
        out |= {
            "alpha": from_fixed(m.alpha),
            "beta": from_fixed(m.beta),
            "delta_bps": m.delta_bps,
            "t_low_ns": m.t_low_ns,
            "t_high_ns": m.t_high_ns,
            "min_rtt_ns": m.min_rtt_ns,
            "hai_steps": m.hai_steps,
        }
    elif p.law is Law.SWIFT:
        w = p.swift
        out |= {
            "ai_bytes": w.ai_bytes,
            "beta": from_fixed(w.beta),
            "max_mdf": from_fixed(w.max_mdf),
            "base_target_ns": w.base_target_ns,
            "per_hop_ns": w.per_hop_ns,
            "sender_ttl": w.sender_ttl,
        }
    return out


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


@functools.cache
def load_profile(name: str) -> Profile:
    """The profile called `name`; a ProfileError naming the known ones otherwise."""
    path = PROFILE_DIR / f"{name}.yaml"
    if "/" in name or not path.is_file():
        raise ProfileError(f"unknown cc profile {name!r} (known: {', '.join(known_profiles())})")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"cc profile {name!r}: {path.name} is not YAML: {exc}") from None
    return parse_profile(doc, name)


def parse_profile(doc: Any, name: str) -> Profile:
    """Check a profile document field by field (every message names the profile)."""

    def bad(msg: str) -> ProfileError:
        return ProfileError(f"cc profile {name!r}: {msg}")

    if not isinstance(doc, dict):
        raise bad("not a mapping")
    extra = set(doc) - {"name", "law", "summary", "source", "parameters", "not_modelled"}
    if extra:
        raise bad(f"unknown keys {sorted(extra)}")
    if doc.get("name") != name:
        raise bad(f"its name is {doc.get('name')!r}, its file says {name!r}")
    laws = {law.name.lower(): law for law in Law}
    if doc.get("law") not in laws:
        raise bad(f"law {doc.get('law')!r} is none of {', '.join(laws)}")
    law = laws[doc["law"]]
    source = doc.get("source")
    if not isinstance(source, dict) or any(not source.get(k) for k in SOURCE_KEYS):
        raise bad(f"source needs {', '.join(SOURCE_KEYS)}")
    raw = doc.get("parameters")
    if not isinstance(raw, dict):
        raise bad("parameters must be a mapping")
    struct = LAW_STRUCT[law]
    want = {"min_rate_bps", *NP_FIELDS.get(law, ())}
    want |= {f.name for f in fields(struct[1])} if struct else set()
    if set(raw) != want:
        missing, unknown = sorted(want - set(raw)), sorted(set(raw) - want)
        raise bad(
            f"the {law.name.lower()} law's parameters are {sorted(want)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; not its own {unknown}" if unknown else "")
        )
    params = {f: _parse_param(f, raw[f], bad) for f in sorted(raw)}
    if params.get("rhai_bps") and params["rhai_bps"].unit == "rai" and "rai_bps" not in params:
        raise bad("rhai_bps in multiples of rai_bps needs rai_bps")
    nm = doc.get("not_modelled") or {}
    if not isinstance(nm, dict) or not all(isinstance(v, str) for v in nm.values()):
        raise bad("not_modelled must map the source's parameter names to why")
    return Profile(
        name,
        law,
        str(doc.get("summary", "")),
        dict(source),
        params,
        {str(k): v for k, v in nm.items()},
    )


def _parse_param(name: str, entry: Any, bad: Any) -> Param:
    kind = FIELD_KIND[name]
    if not isinstance(entry, dict):
        raise bad(f"{name}: give value, unit and from (or chosen)")
    extra = set(entry) - {"value", "unit", "per", "from", "chosen"}
    if extra:
        raise bad(f"{name}: unknown keys {sorted(extra)}")
    if ("from" in entry) == ("chosen" in entry):
        raise bad(f"{name}: say either from (the source's words) or chosen (why), one of them")
    value, unit = entry.get("value"), entry.get("unit")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise bad(f"{name}: value {value!r} must be a number >= 0")
    units = set(UNITS[kind]) | {u for u, k in RELATIVE_UNITS.items() if k == kind}
    if unit not in units:
        raise bad(f"{name}: unit {unit!r} is not a {kind} unit ({', '.join(sorted(units))})")
    if unit == "rai" and name != "rhai_bps":
        raise bad(f"{name}: only rhai_bps may be given in multiples of rai_bps")
    v = Fraction(str(value))  # the decimal as written, exactly
    per = entry.get("per")
    per_bps = None
    if per is not None:
        if kind not in (RATE, TIME) or unit in RELATIVE_UNITS:
            raise bad(f"{name}: per applies to rates and times in physical units only")
        per_bps = _rate(per)
        if per_bps is None or per_bps <= 0:
            raise bad(f"{name}: per {per!r} must be a line rate such as '40 Gb/s'")
    _check_range(name, kind, unit, v, bad)
    return Param(
        name, v, str(unit), per_bps, str(entry.get("from", entry.get("chosen"))), "chosen" in entry
    )


def _rate(text: Any) -> Fraction | None:
    parts = str(text).split()
    if len(parts) != 2 or parts[1] not in UNITS[RATE]:
        return None
    try:
        return Fraction(parts[0]) * UNITS[RATE][parts[1]]
    except ValueError:
        return None


def _check_range(name: str, kind: str, unit: str, v: Fraction, bad: Any) -> None:
    """Ranges a value must hold whatever the line rate (CcParams.validate checks the rest)."""
    if kind == FRACTION:
        f = (DCE_TCP_G_ONE - v) / DCE_TCP_G_ONE if unit == "dce_tcp_g" else v * UNITS[kind][unit]
        if unit == "dce_tcp_g" and (v.denominator != 1 or not 0 < v < DCE_TCP_G_ONE):
            raise bad(f"{name}: DCE_TCP_G {v} must be an integer in (0, {DCE_TCP_G_ONE})")
        low_open = name in ("eta", "g")
        if f > 1 or (low_open and f == 0) or (name == "g" and f == 1):
            raise bad(
                f"{name}: {float(f):g} is outside the fraction's range "
                + ("(0, 1)" if name == "g" else "(0, 1]" if low_open else "[0, 1]")
            )
        if to_fixed(float(f)) == 0 and f > 0:
            raise bad(f"{name}: {float(f):g} is below the NIC's fixed point (1/{UNIT})")
    elif kind == COUNT:
        top = 256 if name == "sender_ttl" else U32
        if v.denominator != 1 or v >= top:
            raise bad(f"{name}: {float(v):g} must be an integer count below {top}")
    elif kind == BYTES and (v * UNITS[kind][unit]).denominator != 1:
        raise bad(f"{name}: {float(v)} {unit} is not a whole number of bytes")
    elif unit == "line" and v > 1:
        raise bad(f"{name}: {float(v):g} of the line rate is above the line rate")
