"""The emulation engine: the fabric booted as Mininet namespaces with real kernels, the switch
processes, the controller and the agents as daemons (`network`, `nodes`, `procs`), Mininet's
CLI (`cli`), the machine check (`doctor`) and the NIC rig (`nicrig`). What both engines share
(the controller's config for a fabric, testbed/ctlconfig.py; the probes' records,
testbed/probes.py) stays at the top of testbed/."""
