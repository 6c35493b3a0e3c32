"""The host agent (`xingmai-agent`): the daemon that runs the emulated NIC's eBPF programs.

- `netdev`: netns, bpffs, XDP/tc/sock_ops attach and detach
- `pacer`: pacing mode detection, per-flow HTB classes (or sch_fq for EDT)
- `agent`: the core (sync loop, controller requests, restart adoption, clean shutdown)
- `service`: the gRPC HostAgent API, `metrics`: Prometheus, `main`: the daemon
"""
