"""The NIC: everything Python about the emulated RoCE NIC (its C is ebpf/).

- `agent/`: the host-agent daemon (`xingmai-agent`) that loads and drives the programs
- `bpf/`: the eBPF loader, the reader of ebpf/xingmai.h, the bpf(2) commands
- `ratelaw`: the rate laws' Python reference, bit-exact with ebpf/xdp_ingress.c (no kernel:
  the simulated twin and the tests run it)
"""
