"""Helpers every xingmai process shares: structured logs (`logs`), network namespaces
(`netns`), Python's garbage collector kept off repeated work (`gc_pause`). Nothing here
knows about the controller, the NIC or the testbed."""
