"""bench/results: a run's results read back: summaries, failures, exports, the results directory."""
