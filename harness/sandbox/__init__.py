"""The OS sandbox: the bwrap plan, the worktree overlay, seccomp, the egress proxy and bridge, exec, files."""
