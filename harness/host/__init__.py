"""The host side: calls with retries, the host tools, and their MCP server (the providers are in queues/)."""
