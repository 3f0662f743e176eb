"""What the test tiers share: loopback servers standing in for GitHub, the Hugging Face hub and model APIs, the
npm adapters, the adapter table, and the policy corpus (`policy_verdicts.jsonl`)."""
