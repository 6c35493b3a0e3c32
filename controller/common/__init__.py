"""Helpers every xingmai process shares: structured logs (`logs`) and network namespaces
(`netns`). Nothing here knows about the controller, the NIC or the testbed."""
