"""The emulation engine: the fabric booted as Mininet namespaces with real kernels, the switch
processes, the controller and the agents as daemons (`network`, `nodes`, `procs`), Mininet's
CLI (`cli`), the machine check (`doctor`) and the NIC rig (`nicrig`). What both engines share
(the controller's config for a fabric, testbed/ctlconfig.py; the probes' records,
testbed/probes.py) stays at the top of testbed/."""

from testbed.errors import require

# the emulation's Python dependencies are the `emu` extra: without it, one line saying so
# (the twin needs none of them)
for _module in ("mininet", "pyroute2", "scapy"):
    require(_module, "the emulation")
