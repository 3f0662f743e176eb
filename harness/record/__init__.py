"""What a run writes: the transcript, its record types and schema, terminals and reasons, recovery."""
