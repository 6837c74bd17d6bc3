"""The chaos run (`make chaos`): the real system under a mixed workload, kills and restarts.

`tools.chaos.run` drives it (docs/failure-model.md, "Chaos run");
`tools.chaos.check` checks the invariants afterwards.
"""
