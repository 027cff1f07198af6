"""Gap learning: per-tool-class gap quantiles, their sketch, and the local gap store."""
