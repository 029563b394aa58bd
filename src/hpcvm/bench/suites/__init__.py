"""bench/suites: the benchmark suites and their registry (none knows where it runs)."""
