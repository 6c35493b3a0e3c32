"""Every congestion-control scheme the experiments know, declared once: its name, the NIC's
rate law it runs, whether the fabric is lossless (PFC in every switch and NIC), how its senders
bound what they keep in flight, how often its receivers ACK, and whether its law takes the
base RTT T. The suite, both engines, the CLIs and the report read this table; the rate laws'
names come from the NIC's own enum (controller.nic.ratelaw.Law, the values of `enum xm_law`
in ebpf/xingmai.h).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from controller.nic.ratelaw import Law
from controller.nic.ratelaw.profiles import (
    DEFAULT_PROFILES,
    Profile,
    known_profiles,
    load_profile,
)

# the NIC's rate laws by name, in the enum's order
RATE_LAWS: tuple[str, ...] = tuple(law.name.lower() for law in Law)
LOSSLESS_SUFFIX = "+pfc"  # a scheme with PFC on in every switch and NIC


@dataclass(frozen=True)
class Scheme:
    name: str
    law: str  # the rate law in every sender's NIC (a RATE_LAWS name)
    lossless: bool = False  # PFC on in every switch and NIC
    # senders keep at most one bandwidth-delay product B*T in flight per flow (else
    # DEFAULT_WINDOW packets per queue pair, as RoCE NICs bound little)
    bdp_window: bool = False
    ack_every: int = 2  # the receivers ACK every N packets
    takes_t: bool = False  # the law is given T (TiTa's and HPCC's B*T, Swift's delay target)
    # the application declares nothing to the NIC: every flow starts at line rate, whatever
    # the proactive start says (TiTa's ablation)
    reactive: bool = False


_SCHEMES = (
    Scheme("none", "none"),
    Scheme("dcqcn", "dcqcn"),
    # TiTa follows HPCC's law and its B*T bound
    Scheme("tita", "tita", bdp_window=True, takes_t=True),
    # TiTa without the proactive start: the law alone, from line rate
    Scheme("tita-reactive", "tita", bdp_window=True, takes_t=True, reactive=True),
    # HPCC: its window W starts at B*T
    Scheme("hpcc", "hpcc", bdp_window=True, takes_t=True),
    # TIMELY and Swift time one packet per RTT: a coalesced ACK would add the wait for the
    # next packet to the RTT
    Scheme("timely", "timely", ack_every=1),
    # Swift is a window law whose cwnd the rate law stands for: without the bound, 64 packets
    # per flow stay in flight whatever its rate
    Scheme("swift", "swift", bdp_window=True, ack_every=1, takes_t=True),
    Scheme("dcqcn+pfc", "dcqcn", lossless=True),
    Scheme("tita+pfc", "tita", lossless=True, bdp_window=True, takes_t=True),
)
BY_NAME: dict[str, Scheme] = {s.name: s for s in _SCHEMES}
# every scheme, in table order
SCHEMES: tuple[str, ...] = tuple(BY_NAME)
# What `make run` compares: DCQCN as RoCE deploys it (on PFC) and as the papers' lossy runs
# had it, against TiTa; no CC for reference.
DEFAULT_SCHEMES: tuple[str, ...] = ("none", "dcqcn", "dcqcn+pfc", "tita")


def scheme(name: str) -> Scheme:
    """The scheme called `name`; a ValueError naming the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown scheme {name!r} (known: {', '.join(SCHEMES)})") from None


def scheme_law(name: str) -> str:
    """The rate law a scheme runs (`dcqcn+pfc` runs DCQCN)."""
    return scheme(name).law


def lossless(name: str) -> bool:
    return scheme(name).lossless


def declares_start(name: str, proactive_start: bool) -> bool:
    """Whether the application declares its flows' start rates to the NIC under `name`: the
    proactive start is on and the scheme has a rate law to start from them (no CC has
    nothing to start) and is not the reactive ablation."""
    s = scheme(name)
    return proactive_start and s.law != "none" and not s.reactive


def law(name: str) -> Law:
    """The NIC's Law of a rate law's name."""
    if name not in RATE_LAWS:
        raise ValueError(f"unknown rate law {name!r} (known: {', '.join(RATE_LAWS)})")
    return Law[name.upper()]


def default_cc_profiles() -> dict[str, str]:
    """The named CC profile of every rate law (controller/nic/ratelaw/profiles.py)."""
    return {law.name.lower(): name for law, name in DEFAULT_PROFILES.items()}


def parse_cc_profiles(text: str) -> dict[str, str]:
    """`--cc-profile`: comma-separated profiles, each `PROFILE` (for its own law) or
    `LAW=PROFILE`; the laws not named keep their default profile. A ValueError names the
    unknown profile (and the known ones) or the law that does not match."""
    out = default_cc_profiles()
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        want, _, name = item.rpartition("=")
        prof = load_profile(name.strip())
        got = prof.law.name.lower()
        if want and want.strip() != got:
            raise ValueError(f"cc profile {prof.name!r} is for {got}, not {want.strip()!r}")
        out[got] = prof.name
    return out


def parse_cc_set(text: str, profiles: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """`--cc-set`: comma-separated `LAW.FIELD=VALUE [UNIT]` (`tita.eta=0.9`,
    `dcqcn.rai_bps=50 Mb/s`): parameters of a law set otherwise than its CC profile says
    (Profile.with_values), per law. Checked against each law's profile in `profiles` (the
    defaults where not given): a ValueError names the unknown law, field or bad value."""
    chosen = profiles or default_cc_profiles()
    out: dict[str, dict[str, str]] = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        where, eq, value = item.partition("=")
        name, dot, fld = where.strip().partition(".")
        if not eq or not dot or not value.strip():
            raise ValueError(f"cc setting {item!r} is not LAW.FIELD=VALUE [UNIT]")
        if name not in RATE_LAWS:
            raise ValueError(f"cc setting {item!r}: unknown rate law {name!r}")
        out.setdefault(name, {})[fld.strip()] = " ".join(value.split())
    for name, settings in out.items():
        load_profile(chosen.get(name) or default_cc_profiles()[name]).with_values(settings)
    return out


def cc_profile(
    scheme_name: str, profiles: dict[str, str], cc_set: dict[str, dict[str, str]]
) -> Profile:
    """The CC profile a scheme runs under these options (its law's in `profiles`, else the
    default, with its law's `cc_set` over it); a ValueError if the profile is another law's."""
    name = scheme_law(scheme_name)
    prof = load_profile(profiles.get(name) or default_cc_profiles()[name])
    if prof.law is not law(name):
        raise ValueError(f"cc profile {prof.name!r} is for {prof.law.name.lower()}, not {name}")
    return prof.with_values(cc_set.get(name, {}))


def cc_profile_name(
    scheme_name: str, profiles: dict[str, str], cc_set: dict[str, dict[str, str]]
) -> str:
    """As results.json names it (`dcqcn-nvidia`, `tita[eta=0.9]`)."""
    return cc_profile(scheme_name, profiles, cc_set).name


def add_ack_argument(ap: argparse.ArgumentParser, default: int | None = None) -> None:
    """`--ack-every N`: the receivers ACK every N packets under every scheme."""
    by: dict[int, list[str]] = {}
    for s in _SCHEMES:
        by.setdefault(s.ack_every, []).append(s.name)
    own = "; ".join(f"{n} under {', '.join(names)}" for n, names in sorted(by.items()))
    ap.add_argument(
        "--ack-every",
        type=int,
        default=default,
        metavar="N",
        help="the receivers ACK every N packets under every scheme (default: "
        + (str(default) if default else "each scheme's own")
        + f"; the schemes' own: {own})",
    )


def check_ack_every(n: int | None) -> None:
    """A ValueError for an --ack-every below 1."""
    if n is not None and n < 1:
        raise ValueError(f"--ack-every must be at least 1, not {n}")


def add_start_argument(ap: argparse.ArgumentParser) -> None:
    """`--proactive-start` / `--no-proactive-start` (SuiteConfig.proactive_start)."""
    reactive = ", ".join(s.name for s in _SCHEMES if s.reactive)
    ap.add_argument(
        "--proactive-start",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the incast's senders and the collectives' ranks declare each flow they start "
        "with its fair share to their NICs before they send, under every scheme with a rate "
        f"law but {reactive} (default: on); --no-proactive-start: every flow starts at line "
        "rate, as the runs before this default did",
    )


def add_cc_arguments(ap: argparse.ArgumentParser) -> None:
    """`--cc-profile` and `--cc-set`, for every command that runs a scheme."""
    defaults = ", ".join(f"{law.name.lower()}={name}" for law, name in DEFAULT_PROFILES.items())
    ap.add_argument(
        "--cc-profile",
        default="",
        metavar="PROFILE[,LAW=PROFILE...]",
        help="named CC profiles (controller/nic/ratelaw/profiles/, docs/"
        "baselines.md), comma-separated: a profile sets its own law's "
        "parameters (LAW=PROFILE names the law too); a law not named runs "
        f"its default ({defaults}). Known: {', '.join(known_profiles())}",
    )
    ap.add_argument(
        "--cc-set",
        default="",
        metavar="LAW.FIELD=VALUE [UNIT],...",
        help="parameters set otherwise than the law's profile says, e.g. "
        "'dcqcn.g=0.0625 fraction,tita.eta=0.9' (a unit the profile's field takes: "
        "b/s, Mb/s, line, ns, us, T, B, packets, fraction, count; none: the profile's); "
        "recorded with the profile's name in results.json",
    )


def cc_config(args: argparse.Namespace) -> dict[str, Any]:
    """SuiteConfig's CC fields from add_cc_arguments' options (a ValueError says what is
    wrong)."""
    profiles = parse_cc_profiles(getattr(args, "cc_profile", ""))
    return {"cc_profiles": profiles, "cc_set": parse_cc_set(getattr(args, "cc_set", ""), profiles)}
