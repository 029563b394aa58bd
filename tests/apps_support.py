"""Helpers for the application suites' tests (openfoam, lammps): one sample run the way
``hpcvm bench`` runs it (the real runner, the real native environment, the store), and
a digest of a directory tree to show that samples leave prepared inputs as they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hpcvm.bench.core.suite import Suite
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.runner import Runner
from hpcvm.store import SampleRecord, Store


def run_samples(out: Path, suite: Suite, np: int, reps: int = 1) -> list[SampleRecord]:
    """A warm-up and ``reps`` samples of ``suite`` at ``np``, natively, through the
    runner into a store under ``out``; the samples as stored (warm-up first)."""
    config = BenchConfig(
        envs=("native",), suites=(suite.name,), np=(np,), reps=reps, seed=1, timeout=600.0
    )
    store = Store.open(out, create=True)
    try:
        run_id = store.create_run(args={}, seed=1, confidence=0.97)
        env = NativeEnvironment()
        store.add_environment(run_id, env.describe())
        Runner(
            store=store,
            run_id=run_id,
            seed=1,
            config=config,
            envs={"native": env},
            suites=[suite],
            out_dir=out,
            sizing_memory=1 << 30,
        ).run()
        return store.samples(run_id)
    finally:
        store.close()


def tree_digest(root: Path) -> str:
    """SHA-256 over every path, file content and symlink target under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_symlink():
            digest.update(str(path.readlink()).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()
