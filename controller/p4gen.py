"""Generate `controller/p4names.py`, the control-plane names of the switch program, from its P4Info.

    python -m controller.p4gen [P4INFO] [--out controller/p4names.py] [--check]

Names are never hand-copied from the P4 source: the controller refers to tables, keys, actions,
parameters, action profiles and counters through these constants, so a renamed table breaks
the generator's check (a test runs it) instead of failing at run time on a switch.

Constant names: `TBL_<alias>`, `KEY_<table alias>_<field>`, `ACT_<alias>`,
`PRM_<action alias>_<param>`, `PROF_<alias>`, `CTR_<alias>`, `DCTR_<alias>`, `REG_<alias>`,
`DIG_<alias>`, `PKTIN_<field>` / `PKTOUT_<field>` (packet I/O metadata), where alias is P4Info's
shortest unique name, upper-cased, dots as underscores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from finsy.proto import p4i
from google.protobuf import text_format

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_P4INFO = ROOT / "p4src" / "build" / "xingmai.p4info.txtpb"
DEFAULT_OUT = ROOT / "controller" / "p4names.py"


def _ident(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", "_".join(parts)).strip("_").upper()


def generate(p4info_text: str, source: str) -> str:
    info = p4i.P4Info()
    text_format.Parse(p4info_text, info)
    sha = hashlib.sha256(p4info_text.encode()).hexdigest()
    out = [
        f'"""Control-plane names of the switch program, generated from {source} by',
        "`python -m controller.p4gen`. Do not edit: a test fails when this file and the P4Info",
        'differ."""',
        "",
        "# ruff: noqa: E501",
        f'P4INFO_SHA256 = "{sha}"',
        "",
    ]
    seen: dict[str, str] = {}

    def const(name: str, value: str) -> None:
        if name in seen and seen[name] != value:
            raise ValueError(f"two P4 objects generate {name}: {seen[name]} and {value}")
        if name not in seen:
            seen[name] = value
            out.append(f"{name} = {json.dumps(value)}")  # as ruff format writes it

    out.append("# tables and their match fields")
    for t in sorted(info.tables, key=lambda t: t.preamble.name):
        const(_ident("TBL", t.preamble.alias), t.preamble.name)
        for mf in t.match_fields:
            const(_ident("KEY", t.preamble.alias, mf.name), mf.name)
    out.append("")
    out.append("# actions and their parameters")
    for a in sorted(info.actions, key=lambda a: a.preamble.name):
        const(_ident("ACT", a.preamble.alias), a.preamble.name)
        for p in a.params:
            const(_ident("PRM", a.preamble.alias, p.name), p.name)
    out.append("")
    out.append("# packet-in / packet-out metadata")
    for cpm in sorted(info.controller_packet_metadata, key=lambda c: c.preamble.name):
        prefix = {"packet_in": "PKTIN", "packet_out": "PKTOUT"}.get(
            cpm.preamble.name, cpm.preamble.name
        )
        for m in cpm.metadata:
            const(_ident(prefix, m.name), m.name)
    out.append("")
    out.append("# action profiles, counters, registers, digests")
    for prefix, items in (
        ("PROF", info.action_profiles),
        ("CTR", info.counters),
        ("DCTR", info.direct_counters),
        ("REG", info.registers),
        ("DIG", info.digests),
    ):
        for it in sorted(items, key=lambda x: x.preamble.name):
            const(_ident(prefix, it.preamble.alias), it.preamble.name)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("p4info", nargs="?", type=Path, default=DEFAULT_P4INFO)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the output file differs from what the P4Info generates",
    )
    args = ap.parse_args(argv)
    try:
        text = args.p4info.read_text()
    except OSError as exc:
        print(f"cannot read {args.p4info}: {exc}", file=sys.stderr)
        return 2
    try:
        source = str(args.p4info.resolve().relative_to(ROOT))
    except ValueError:
        source = str(args.p4info)
    code = generate(text, source)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != code:
            print(f"{args.out} is out of date: run python -m controller.p4gen", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(code)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
