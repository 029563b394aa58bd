"""bench/envs: where a sample runs: native, VMs and containers behind one interface."""
