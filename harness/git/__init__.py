"""The kernel's git: preconditions, upstreams, the worktree lock, its own commit, inotify on tree and repository."""
