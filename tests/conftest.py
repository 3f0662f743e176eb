"""Shared test wiring: the harness's pytest plugin is loaded through its entry point."""
