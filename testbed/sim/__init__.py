"""The simulated twin: the testbed's fabric in one process under a virtual clock.

The same code as the emulation, driven by events instead of kernels: the built-in switch's
compiled pipeline and traffic manager (testbed.switch) on a virtual clock, programmed in
process through its P4Runtime Write path with the entries the controller's own code derives
(controller.program, controller.queues); NICs running the rate laws' reference
(controller.nic.ratelaw, bit-exact with XDP), the tc egress INT source and a pacer that sends
each flow at exactly its rate; hosts running the transport's sans-I/O core
(testbed.traffic.transport_core) and the workloads' jobs (testbed.traffic.jobs).

- `engine`: the discrete-event loop (virtual ns clock, ordered heap);
- `fabric`: switches, links, NICs and hosts built from a testbed.topo FabricSpec;
- `suite`: the scenario suite (testbed.experiment.suite) on the twin.
"""
