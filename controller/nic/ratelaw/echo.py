"""The INT echo of an ACK as XDP reads it (xm_tita_on_ack()'s parse): the hops' values the
rate laws use, or why the echo is not used."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from controller.nic.ratelaw.base import ALL_ONES32, MAX_HOPS
from controller.wire.int_md import (
    BIT_EGRESS_TS,
    BIT_L1_PORTS,
    BIT_NODE_ID,
    BIT_QUEUE,
    BIT_TX_UTIL,
    HEADERS_LEN,
    HOP_ML_MAX,
    INT_TYPE_MD,
    INT_VERSION,
    MD_WORDS,
    SHIM_LEN,
    hop_ml_words,
    shim_total_len,
)

HOP_ABSENT = 32  # XM_HOP_ABSENT: a word index past any hop, all-ones in XDP's hop buffer
HOP_BUF_WORDS = 65  # XM_HOP_BUF_WORDS


def _field_off(bitmap: int, b: int) -> int:
    before = bitmap & ((0xFFFF << (16 - b)) & 0xFFFF)
    return hop_ml_words(before) if (bitmap >> (15 - b)) & 1 else HOP_ABSENT


@dataclass(frozen=True)
class IntHopValues:
    """One hop's fields as XDP reads them (all-ones where not requested or not provided)."""

    node_id: int
    port: int
    qlen: int  # bytes, 0 when absent
    egress_ts_ns: int  # NO_TS when absent
    tx_util_ppm: int  # ALL_ONES32 when absent


class EchoError(enum.Enum):
    """Why an ACK's echo is not used (the XM_CNT_XDP_* counter it feeds)."""

    NO_INT = "XDP_ACK_NO_INT"
    BAD_HEADER = "XDP_INT_BAD_HEADER"
    BAD_LENGTH = "XDP_INT_BAD_LENGTH"
    TOO_MANY_HOPS = "XDP_INT_TOO_MANY_HOPS"


def parse_echo(echo: bytes) -> list[IntHopValues] | EchoError:
    """The INT echo after an ACK's AETH (ICRC excluded), as xm_tita_on_ack() parses it."""
    if (
        len(echo) < HEADERS_LEN
        or echo[0] >> 4 != INT_TYPE_MD
        or shim_total_len(echo[1]) != len(echo)
    ):
        return EchoError.NO_INT
    md = echo[SHIM_LEN:HEADERS_LEN]
    if md[0] >> 4 != INT_VERSION:
        return EchoError.BAD_HEADER
    hop_ml = md[2] & HOP_ML_MAX
    bitmap = (md[4] << 8) | md[5]
    if hop_ml == 0 or hop_ml_words(bitmap) != hop_ml:
        return EchoError.BAD_HEADER
    stack_words = echo[1] - MD_WORDS
    if stack_words % hop_ml:
        return EchoError.BAD_LENGTH
    nh = stack_words // hop_ml
    if nh == 0:
        return EchoError.NO_INT
    if nh > MAX_HOPS:
        return EchoError.TOO_MANY_HOPS
    offs = {
        b: _field_off(bitmap, b)
        for b in (BIT_NODE_ID, BIT_L1_PORTS, BIT_QUEUE, BIT_EGRESS_TS, BIT_TX_UTIL)
    }
    hops = []
    for i in range(nh):
        base = HEADERS_LEN + i * hop_ml * 4
        words = list(struct.unpack(f"!{hop_ml}I", echo[base : base + hop_ml * 4]))
        words += [ALL_ONES32] * (HOP_BUF_WORDS - len(words))

        def word(idx: int, words: list[int] = words) -> int:
            return words[idx & 63]

        q = word(offs[BIT_QUEUE])
        ts = offs[BIT_EGRESS_TS]
        hops.append(
            IntHopValues(
                node_id=word(offs[BIT_NODE_ID]),
                port=word(offs[BIT_L1_PORTS]) & 0xFFFF,
                qlen=0 if q == ALL_ONES32 else q & 0xFFFFFF,
                egress_ts_ns=(word(ts) << 32) | word(ts + 1),
                tx_util_ppm=word(offs[BIT_TX_UTIL]),
            )
        )
    return hops
