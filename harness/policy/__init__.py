"""The workspace policy: rules, the command and shell readers, and the change set judged at the boundary."""
