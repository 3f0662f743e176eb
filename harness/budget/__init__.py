"""Workload budgets while the agent works: the account, the task watch, the change meter, questions."""
