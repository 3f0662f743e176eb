"""`loop-harness check`: the kernel probes any agent, the CLI table, and an agent's process tree."""
