"""``--address auto`` (cluster/tasks/addresses.py): the slots of a node in the site's pool,
derived from the node's own address, never shared between nodes; claims that die with
their holder. Oracle: Python's ipaddress arithmetic done here independently, and real
processes (a live one holding a claim, a dead one leaving a stale one)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.cluster.tasks.addresses import AddressPool, candidates, claim, site_pool
from hpcvm.errors import UsageError

POOL = AddressPool(ipaddress.IPv4Network("10.77.0.128/25"), 4)


def test_each_node_owns_slots_of_its_own_in_the_pool() -> None:
    node3 = candidates(POOL, ipaddress.IPv4Interface("10.77.0.3/24"))
    assert [str(a) for a in node3] == [f"10.77.0.{128 + 1 + 12 + s}/24" for s in range(4)]
    seen: set[ipaddress.IPv4Address] = set()
    for host in range(1, 30):
        got = {a.ip for a in candidates(POOL, ipaddress.IPv4Interface(f"10.77.0.{host}/24"))}
        assert not got & seen, host  # no address of two nodes
        assert all(a in POOL.network and a != POOL.network.broadcast_address for a in got)
        seen |= got


def test_a_node_beyond_the_pool_is_refused_with_the_fix() -> None:
    with pytest.raises(UsageError, match="widens the pool"):
        candidates(POOL, ipaddress.IPv4Interface("10.77.0.200/24"))


def test_a_pool_outside_the_nodes_subnet_keeps_its_own_prefix() -> None:
    pool = AddressPool(ipaddress.IPv4Network("10.88.0.0/16"), 2)
    (first, _) = candidates(pool, ipaddress.IPv4Interface("10.77.0.5/24"))
    assert first == ipaddress.IPv4Interface("10.88.0.11/16")


def test_site_pool_reads_the_config_and_refuses_what_is_missing(tmp_path: Path) -> None:
    conf = tmp_path / "site.toml"
    conf.write_text('[addresses]\npool = "10.77.0.128/25"\nslots = 2\n')
    assert site_pool(conf) == AddressPool(ipaddress.IPv4Network("10.77.0.128/25"), 2)
    with pytest.raises(UsageError, match="admin sets"):
        site_pool(tmp_path / "none.toml")
    conf.write_text('[addresses]\npool = "10.77.0.129/25"\n')  # host bits set
    with pytest.raises(UsageError, match="malformed"):
        site_pool(conf)


def test_a_claim_lives_with_its_holder(tmp_path: Path) -> None:
    address = ipaddress.IPv4Interface("10.77.0.140/24")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, ipaddress, time, pathlib\n"
         "from hpcvm.cluster.tasks.addresses import claim\n"
         f"c = claim(ipaddress.IPv4Interface('{address}'), pathlib.Path(sys.argv[1]))\n"
         "print('held' if c and c.path else 'refused', flush=True); time.sleep(60)",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert claim(address, tmp_path) is None  # a live process holds it
    finally:
        holder.kill()
        holder.wait()
    mine = claim(address, tmp_path)  # its holder is gone: taken over
    assert mine is not None and mine.path is not None
    assert mine.path.parent == tmp_path and mine.path.name.startswith("10.77.0.140.")
    assert mine.path.read_text().split()[0] == str(os.getpid())
    mine.release()
    assert list(tmp_path.iterdir()) == []  # the dead holder's file went too
