"""What the test tiers share: loopback servers standing in for GitHub and the Hugging Face hub (the model APIs'
stand-ins are `harness.fake_model`), the npm adapters, the adapter table, the policy corpus
(`policy_verdicts.jsonl`), and a bare ACP agent for the agent's process contract (`process_agent.py`)."""
