"""Pure-Python reference of the NIC's rate laws, in the same fixed point as the eBPF code.

ebpf/xdp_ingress.c runs these laws per feedback packet; these modules do the same integer
operations in the same order, so tests can feed both the same packets and compare the rates
packet by packet, and the simulated twin can run many NICs without kernels. Change one, change
the other. One module per law, and what they share:

- `base`: the fixed point (UNIT = 2**20), the law codes, the per-flow state, shared helpers
- `echo`: the INT echo of an ACK as XDP parses it
- `params`: `struct xm_cc_params` (the law and each law's parameters, with their defaults)
- `tita`: TiTa (HPCC-like) and HPCC as published, `dcqcn`: DCQCN's reaction point
- `timely`: TIMELY, `swift`: Swift, both on RTT samples from `rtt` (tc's probe)
- `reference`: the reference NIC, frame by frame (feedback parse, per-flow state, dispatch)
"""

from controller.nic.ratelaw.base import NO_TS, UNIT, CcState, Law, from_fixed, psn_ge, to_fixed
from controller.nic.ratelaw.dcqcn import dcqcn_on_feedback, fx_pow
from controller.nic.ratelaw.echo import EchoError, IntHopValues, parse_echo
from controller.nic.ratelaw.params import (
    HPCC_MAX_STAGE,
    CcParams,
    DcqcnParams,
    SwiftParams,
    TimelyParams,
    TitaParams,
    hpcc_defaults,
    with_law,
)
from controller.nic.ratelaw.reference import ReferenceNic, parse_feedback
from controller.nic.ratelaw.rtt import (
    RTT_LAWS,
    RttProbe,
    take_rtt_sample,
    tc_rtt_probe,
    wire_stamp_rtt_probe,
)
from controller.nic.ratelaw.swift import swift_on_rtt
from controller.nic.ratelaw.timely import timely_on_rtt
from controller.nic.ratelaw.tita import HopSpeed, tita_on_ack

__all__ = [
    "HPCC_MAX_STAGE",
    "RTT_LAWS",
    "RttProbe",
    "SwiftParams",
    "TimelyParams",
    "hpcc_defaults",
    "swift_on_rtt",
    "take_rtt_sample",
    "tc_rtt_probe",
    "wire_stamp_rtt_probe",
    "timely_on_rtt",
    "NO_TS",
    "UNIT",
    "CcParams",
    "CcState",
    "DcqcnParams",
    "EchoError",
    "HopSpeed",
    "IntHopValues",
    "Law",
    "ReferenceNic",
    "TitaParams",
    "dcqcn_on_feedback",
    "from_fixed",
    "fx_pow",
    "parse_echo",
    "parse_feedback",
    "psn_ge",
    "tita_on_ack",
    "to_fixed",
    "with_law",
]
