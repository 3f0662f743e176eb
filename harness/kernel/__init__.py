"""The kernel: the Kernel facade, one Run, the turn decision, and the completed-task record."""
