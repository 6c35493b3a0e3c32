"""The emulation engine: the fabric booted as Mininet namespaces with real kernels, the switch
processes, the controller and the agents as daemons (`network`, `nodes`, `procs`), the
controller's config for it (`ctlconfig`), what it measures while traffic runs (`probes`),
Mininet's CLI (`cli`), the machine check (`doctor`) and the NIC rig (`nicrig`)."""
