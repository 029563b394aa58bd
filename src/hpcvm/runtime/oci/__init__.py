"""OCI containers through a real runtime (crun, runc), and the bundles they run."""
