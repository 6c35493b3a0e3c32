"""Pure-Python reference of the NIC's rate laws, in the same fixed point as the eBPF code.

ebpf/xdp_ingress.c runs these laws per feedback packet; these modules do the same integer
operations in the same order, so tests can feed both the same packets and compare the rates
packet by packet, and the simulated twin can run many NICs without kernels. Change one, change
the other. One module per law, and what they share:

- `base`: the fixed point (UNIT = 2**20), the law codes, the per-flow state, shared helpers
- `echo`: the INT echo of an ACK as XDP parses it
- `tita`: TiTa (HPCC-like), `dcqcn`: DCQCN's reaction point, each with its parameters
- `params`: `struct xm_cc_params` (the law and the laws' parameters)
- `reference`: the reference NIC, frame by frame (feedback parse, per-flow state, dispatch)
"""

from controller.nic.ratelaw.base import NO_TS, UNIT, CcState, Law, from_fixed, psn_ge, to_fixed
from controller.nic.ratelaw.dcqcn import DcqcnParams, dcqcn_on_feedback, fx_pow
from controller.nic.ratelaw.echo import EchoError, IntHopValues, parse_echo
from controller.nic.ratelaw.params import CcParams, with_law
from controller.nic.ratelaw.reference import ReferenceNic, parse_feedback
from controller.nic.ratelaw.tita import HopSpeed, TitaParams, tita_on_ack

__all__ = [
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
