"""The NIC's eBPF programs from Python: `loader` compiles ebpf/*.c with bcc, adopts or creates
their pinned maps and gives typed map access; `header` reads ebpf/xingmai.h's constants (the
one declaration of the map list, flags and enums); `syscalls` holds the bpf(2) commands bcc's
Python module lacks (pins, cgroup attach, test runs)."""
