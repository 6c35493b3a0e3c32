"""The engine-neutral experiment layer: the schemes (`schemes`), the scenario suite and its
records (`suite`), the table, verdict and results file (`report`), the plots (`plots`) and
what a run was measured on (`machine`). It imports no engine: the emulation (testbed.emu)
and the twin (testbed.sim) implement `suite.Suite`'s engine hooks."""
