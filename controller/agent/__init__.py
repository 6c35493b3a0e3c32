"""The host agent (`xingmai-agent`): the emulated NIC's eBPF programs and their control plane.

- `bpfload`: compile ebpf/*.c with bcc, adopt/create pinned maps, typed map access
- `bpfsys`: the bpf(2) commands bcc's Python module lacks (pins, cgroup attach, test runs)
- `netdev`: netns, bpffs, XDP/tc/sock_ops attach and detach
- `pacer`: pacing mode detection, per-flow HTB classes (or sch_fq for EDT)
- `agent`: the core (sync loop, controller requests, restart adoption, clean shutdown)
- `service`: the gRPC HostAgent API, `metrics`: Prometheus, `main`: the daemon
"""
