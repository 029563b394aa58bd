"""The order in which environments run within each repetition block.

Slow drift of the machine (temperature, other tenants, a growing page cache) would bias
whichever environment always runs at the same point of a block; a fresh random order in
every block spreads it over all of them (METHOD.md, "Interleave"). The order of block k
depends only on (seed, k), so a resumed run recomputes the very same schedule without
replaying the earlier blocks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from hpcvm.errors import UsageError


def interleaved_order(envs: Sequence[str], block: int, seed: int) -> list[str]:
    """A random permutation of ``envs`` for repetition block ``block`` (0-based).

    Deterministic for a given ``seed``: ``random.Random`` seeded with a string that
    names both seed and block (string seeds are hashed with SHA-512, so the result does
    not depend on PYTHONHASHSEED or the platform).
    """
    if block < 0:
        raise UsageError(f"repetition block must be 0 or more, not {block}")
    if len(set(envs)) != len(envs):
        dup = sorted({e for e in envs if list(envs).count(e) > 1})
        raise UsageError(f"environment listed twice: {', '.join(dup)}; give each --env once")
    order = list(envs)
    random.Random(f"hpcvm-interleave:{seed}:{block}").shuffle(order)
    return order


def interleaved_schedule(envs: Sequence[str], blocks: int, seed: int) -> list[list[str]]:
    """The orders of blocks 0 .. blocks-1 (see ``interleaved_order``)."""
    return [interleaved_order(envs, b, seed) for b in range(blocks)]
