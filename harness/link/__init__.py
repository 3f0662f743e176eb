"""The ACP link to the agent: the process transport, the connection, and the kernel's client side."""
