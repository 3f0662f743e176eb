"""The run config: its pydantic models and loader, the autonomy models, and the error tree."""
