"""The wire formats are declared once in Python (controller/wire); the C and P4 sources must
agree with that declaration. These tests read ebpf/xingmai.h and p4src/include/*.p4 as text
and fail on any constant or header layout that disagrees, or on a new XM_* constant that no
one has decided about."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.nic.bpf import header, loader
from controller.nic.ratelaw import base, dcqcn, echo, params
from controller.wire import int_md, pfc, roce
from controller.wire import telemetry_report as tr
from controller.wire.layout import Fields

REPO = Path(__file__).resolve().parents[1]
DEFINE_P4 = REPO / "p4src" / "include" / "define.p4"
HEADER_P4 = REPO / "p4src" / "include" / "header.p4"

# ---- ebpf/xingmai.h --------------------------------------------------------------------------

# Each XM_* #define and what Python holds it as (None: a C-only fact, not on the wire and not
# mirrored by the rate-law reference).
C_DEFINES: dict[str, int | None] = {
    "XM_UNIT_SHIFT": base.UNIT_SHIFT,
    "XM_UNIT": base.UNIT,
    "XM_U_MAX": base.U_MAX,
    "XM_MAX_HOPS": base.MAX_HOPS,
    "XM_NSEC": base.NSEC,
    "XM_ROCE_PORT": roce.ROCE_UDP_PORT,
    "XM_ALL_ONES32": base.ALL_ONES32,
    "XM_BTH_LEN": roce.BTH_LEN,
    "XM_AETH_LEN": roce.AETH_LEN,
    "XM_ICRC_LEN": roce.ICRC_LEN,
    "XM_INT_SHIM_LEN": int_md.SHIM_LEN,
    "XM_INT_MD_LEN": int_md.MD_LEN,
    "XM_OP_ACK": roce.OP_ACK,
    "XM_OP_CNP": roce.OP_CNP,
    "XM_OP_DATA_MAX": roce.OP_RC_DATA_MAX,
    "XM_AETH_NAK_MIN": roce.AETH_NAK_PSN_SEQ_ERR,
    "XM_ETH_P_MAC_CONTROL": pfc.ETH_P_MAC_CONTROL,
    "XM_PFC_OPCODE": pfc.PFC_OPCODE,
    "XM_PFC_LEN": pfc.PFC_BYTES,
    "XM_PFC_PRIORITIES": pfc.PRIORITIES,
    "XM_PFC_QUANTUM_BITS": pfc.QUANTUM_BITS,
    "XM_CTL_HAS_CAP": loader.CTL_HAS_CAP,
    "XM_CTL_HAS_PARAMS": loader.CTL_HAS_PARAMS,
    "XM_FLOW_PSN_VALID": None,
    "XM_NO_TS": base.NO_TS,
    "XM_CC_HAVE_RECORDS": base.HAVE_RECORDS,
    "XM_CC_PSN_VALID": base.PSN_VALID,
    "XM_CC_CUT_SEEN": base.CUT_SEEN,
    "XM_CC_TIMER_INC": base.TIMER_INC,
    "XM_DCQCN_CLAMP_ALWAYS": params.DCQCN_CLAMP_ALWAYS,
    "XM_DCQCN_CLAMP_AFTER_TIMER": params.DCQCN_CLAMP_AFTER_TIMER,
    "XM_HOP_ABSENT": echo.HOP_ABSENT,
    "XM_HOP_BUF_WORDS": echo.HOP_BUF_WORDS,
    "XM_MAX_FLOWS": None,
    # lib/*.h
    "XM_HOP_MAX_WORDS": int_md.HOP_ML_MAX,
    "XM_DCQCN_BACKLOG": dcqcn.DCQCN_BACKLOG,
}


def test_every_c_define_is_the_python_value() -> None:
    defines = header.defines()
    text = "\n".join(p.read_text() for p in header.headers())
    # the reader must see every integer #define the headers have (else a constant could hide)
    written = set(re.findall(r"^#define\s+(XM_[A-Z0-9_]+)\s+[(0-9]", text, re.M))
    assert written == set(defines), "header.defines() misses " + str(written - set(defines))
    assert set(defines) == set(C_DEFINES), (
        "XM_* constants added or removed in ebpf/xingmai.h: decide in C_DEFINES whether Python "
        f"holds them: {sorted(set(defines) ^ set(C_DEFINES))}"
    )
    for name, want in C_DEFINES.items():
        if want is not None:
            assert defines[name] == want, f"{name}: C {defines[name]:#x}, Python {want:#x}"


def test_c_enums_are_the_python_ones() -> None:
    assert {f"XM_LAW_{law.name}": law.value for law in base.Law} == header.enum("xm_law")
    # the agents' API names the same laws (the controller's config reads them from there,
    # the testbed's schemes from the NIC's enum)
    from controller.config import RATE_LAWS
    from testbed.experiment.schemes import RATE_LAWS as TESTBED_LAWS

    assert set(RATE_LAWS) == set(TESTBED_LAWS) == {law.name.lower() for law in base.Law}
    assert loader.PACING_HTB == 0 and loader.PACING_EDT == 1  # derived; these are the wire
    assert set(loader.ORIGINS.values()) == {"agent", "tita", "dcqcn", "hpcc", "timely", "swift"}
    # an XDP-written rate carries its law's value as origin (nr.origin = law)
    assert all(loader.ORIGINS[law.value] == law.name.lower() for law in base.Law if law)
    counters = header.enum("xm_counter")
    assert list(counters)[-1] == "XM_CNT_MAX" and counters["XM_CNT_MAX"] == len(counters) - 1
    assert len(loader.counter_names()) == len(counters) - 1
    # the reference names the counters it feeds: each must exist in C
    names = {n.removeprefix("XM_CNT_") for n in counters}
    for err in echo.EchoError:
        assert err.value in names


def test_struct_layouts_read_from_the_header_follow_c_alignment(tmp_path: Path) -> None:
    """header.struct_layout is how a reader without bcc (the transport's PinnedPfc) gets a
    map value's bytes; it lays fields out as the compiler does. (The root test
    test_nic_pfc.py reads the real map through it.)"""
    names, layout = header.struct_layout("xm_pfc_state")
    assert names == (
        "pause_until_ns",
        "since_ns",
        "paused_ns",
        "pauses",
        "resumes",
        "active",
        "pad",
    )
    assert layout.size == 48
    h = tmp_path / "h.h"
    h.write_text(
        "struct t {\n\t__u8 a; /* one */\n\t__u32 b;\n\t__u16 c;\n\t__u64 d;\n"
        "\t__u8 e;\n};\nstruct u { __u32 x; struct t y; };\n"
    )
    names, layout = header.struct_layout("t", h)
    assert names == ("a", "b", "c", "d", "e") and layout.size == 32
    assert layout.unpack(layout.pack(1, 2, 3, 4, 5)) == (1, 2, 3, 4, 5)
    assert layout.pack(1, 2, 3, 4, 5)[4:8] == (2).to_bytes(4, "little")  # b after 3 pad bytes
    with pytest.raises(ValueError, match="not a scalar field"):
        header.struct_layout("u", h)


def test_bpfload_map_list_is_the_header_declarations() -> None:
    text = "\n".join(p.read_text() for p in header.headers())
    assert len(loader.MAPS) == text.count("BPF_TABLE_PINNED(") + 1 == 12
    assert loader.RING_BUFFERS == ("xm_events",) and "xm_events" in loader.MAPS
    for name in loader.MAPS:
        assert f'XM_PIN("{name}")' in text


def test_words_per_hop_is_the_c_formula_for_every_bitmap() -> None:
    # xm_int_words(): popcount of the bitmap plus popcount of the two-word bits; the mask is
    # read from the C so that a change there fails here.
    text = (header.EBPF_DIR / "lib" / "helpers.h").read_text()
    m = re.search(r"xm_popcount16\(bitmap\) \+ xm_popcount16\(bitmap & (0x[0-9a-f]+)\)", text)
    assert m, "xm_int_words() no longer has the form this test reads"
    two_words = int(m.group(1), 16)
    for bitmap in range(1 << 16):
        c = bin(bitmap).count("1") + bin(bitmap & two_words).count("1")
        assert int_md.hop_ml_words(bitmap) == c, f"bitmap {bitmap:#06x}"


# ---- p4src/include ---------------------------------------------------------------------------


def p4_constants() -> dict[str, int]:
    text = DEFINE_P4.read_text()
    out = {
        n: int(v, 0)
        for n, v in re.findall(r"^const bit<\d+> (\w+) = (0[xXbB]?[0-9a-fA-F]+|\d+);", text, re.M)
    }
    for n, expr in re.findall(r"^const bit<\d+> (\w+) = ([\d +]+);", text, re.M):
        out[n] = sum(int(t) for t in expr.split("+"))
    out |= {
        n: int(v, 0) for n, v in re.findall(r"^#define (\w+) (0x[0-9a-fA-F]+|\d+)$", text, re.M)
    }
    return out


def p4_header(name: str) -> Fields:
    m = re.search(rf"^header {name} \{{(.*?)^\}}", HEADER_P4.read_text(), re.M | re.S)
    assert m, f"header {name} not in {HEADER_P4}"
    return tuple((f, int(w)) for w, f in re.findall(r"bit<(\d+)> (\w+);", m.group(1)))


def p4_struct(name: str) -> list[tuple[str, str, str]]:
    """(header type, member, comment) of each member of a P4 struct."""
    m = re.search(rf"^struct {name} \{{(.*?)^\}}", HEADER_P4.read_text(), re.M | re.S)
    assert m, f"struct {name} not in {HEADER_P4}"
    return re.findall(r"^\s*(\w+) (\w+);[ \t]*(?://[ \t]*(.*))?$", m.group(1), re.M)


# P4 spells a few fields differently: the layouts must match name for name otherwise.
P4_NAMES = {"int_type": "type", "len": "length", "seq_no": "seq"}


def same_layout(p4: Fields, py: Fields) -> bool:
    return tuple((P4_NAMES.get(n, n), w) for n, w in p4) == py


def test_p4_constants_are_the_wire_values() -> None:
    c = p4_constants()
    assert c["INT_DSCP"] == int_md.INT_DSCP_DEFAULT
    assert c["INT_TYPE_MD"] == int_md.INT_TYPE_MD
    assert c["INT_VERSION"] == int_md.INT_VERSION
    assert c["INT_MD_WORDS"] == int_md.MD_WORDS
    assert c["INT_HEADERS_BYTES"] == int_md.HEADERS_LEN
    assert c["REPORT_VERSION"] == tr.REPORT_VERSION
    assert c["REPORT_TYPE_INT"] == tr.REPORT_TYPE_INT
    assert c["REPORT_IN_TYPE_IPV4"] == tr.IN_TYPE_IPV4
    assert c["REPORT_UDP_SPORT"] == tr.TELEMETRY_REPORT_PORT
    assert c["REPORT_IP_HEADERS_BYTES"] == 20 + 8 + tr.GROUP_LEN + tr.INDIVIDUAL_LEN
    assert c["REPORT_UDP_HEADERS_BYTES"] == 8 + tr.GROUP_LEN + tr.INDIVIDUAL_LEN
    supported = int_md.set_bits(c["REPORT_MD_SUPPORTED"], tr.REPORT_METADATA)
    assert supported == [1, 2, 3, 4, 5, 7]  # RepMdBits the sink fills: none reserved
    assert bin(c["REPORT_MD_SUPPORTED"]).count("1") == len(supported)


@pytest.mark.parametrize(
    ("p4", "py"),
    [
        ("int_shim_t", int_md.SHIM_FIELDS),
        ("int_md_t", int_md.MD_FIELDS),
        ("report_group_t", tr.GROUP_FIELDS),
        ("report_individual_t", tr.INDIVIDUAL_FIELDS),
    ],
)
def test_p4_header_layouts_are_the_wire_tables(p4: str, py: Fields) -> None:
    assert same_layout(p4_header(p4), py), f"{p4}: {p4_header(p4)} vs {py}"


def test_p4_hop_record_is_the_hop_metadata_table() -> None:
    members = p4_struct("int_hop_t")
    assert len(members) == 16
    for bit, (htype, _member, _comment) in enumerate(members):
        widths = [w for _, w in p4_header(htype)]
        want = [w for _, w in int_md.HOP_METADATA[bit]]
        if htype == "int_word_t":  # a unit the switch does not fill: all-ones, size only
            assert widths == [sum(want)], f"bit {bit}: {htype}"
        else:
            assert widths == want, f"bit {bit}: {htype}"


def test_p4_report_metadata_is_the_report_metadata_table() -> None:
    members = p4_struct("report_md_t")
    assert members, "report_md_t has no members"
    for htype, member, comment in members:
        m = re.match(r"bit (\d+)", comment)
        assert m, f"report_md_t.{member}: no '// bit N' comment"
        bit = int(m.group(1))
        widths = [w for _, w in p4_header(htype)]
        assert widths == [w for _, w in tr.REPORT_METADATA[bit]], f"bit {bit}: {htype}"
    bits = [int(re.match(r"bit (\d+)", c).group(1)) for _, _, c in members]  # type: ignore[union-attr]
    assert bits == int_md.set_bits(p4_constants()["REPORT_MD_SUPPORTED"], tr.REPORT_METADATA)


# ---- the wire package stands alone --------------------------------------------------


def test_wire_package_and_collector_load_without_scapy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, controller.wire.int_md, controller.wire.roce, "
        "controller.wire.telemetry_report, controller.collector, controller.nic.ratelaw\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('scapy', 'testbed'))\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
