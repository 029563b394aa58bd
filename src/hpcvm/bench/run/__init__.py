"""bench/run: one bench run: choices, config, cells, the sampling loop and the session."""
