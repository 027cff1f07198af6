"""Policy: the advisor, the retention cost model and KV sizes (pure, no I/O)."""
