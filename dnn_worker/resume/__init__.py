"""Which batches a rank owns and where it stands: the epoch's batch list, sharding and resharding of resume state, and the exactly-once audit."""
