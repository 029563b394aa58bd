"""Are `hpcvm plan` outputs byte-identical between a git revision and the working tree?

For refactors that must change nothing a user sees (issue 14: render targets moved into
a registry): every render target (and the table) for every profile, two VM sizes and
every topology snapshot in ../shared/topologies/ (hwloc XML files and sysfs archives),
produced by each tree's own `hpcvm plan` command in one process per tree, then compared
output by output, exit code and stderr included.

    .venv/bin/python benchmarks/render_identity.py [--ref HEAD]

Prints the number of cases and every difference; exits 1 when any output differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPOLOGIES = REPO.parent / "shared" / "topologies"
FORMATS = ("table", "json", "qemu", "libvirt", "openstack", "kubevirt")
PROFILES = ("naive", "pinned", "hugepages", "numa", "hpc")
SIZES = (("2", "1G"), ("8", "4G"))

# Run inside the tree under test: its own CLI, with the host read once per topology.
DUMP = r"""
import functools, json, sys
from pathlib import Path
from click.testing import CliRunner
import hpcvm.host
hpcvm.host.discover = functools.cache(hpcvm.host.discover)  # before plan_cmd binds it
from hpcvm.cli.main import cli
cases = json.loads(Path(sys.argv[1]).read_text())
runner = CliRunner()
out = {}
for key, args in cases.items():
    result = runner.invoke(cli, args, terminal_width=200)
    out[key] = [result.exit_code, result.stdout, result.stderr, str(result.exception or "")]
Path(sys.argv[2]).write_text(json.dumps(out))
"""


def topologies(scratch: Path) -> dict[str, list[str]]:
    """Topology name -> the hpcvm option that reads it."""
    found = {f"xml:{p.stem}": ["--topology", str(p)] for p in sorted(TOPOLOGIES.glob("xml/*.xml"))}
    for archive in sorted(TOPOLOGIES.glob("sysfs/*.tar.bz2")):
        name = archive.name.removesuffix(".tar.bz2")
        with tarfile.open(archive) as tar:
            tar.extractall(scratch / name, filter="tar")
        found[f"sysfs:{name}"] = ["--sysfs-root", str(scratch / name)]
    return found


def cases(scratch: Path) -> dict[str, list[str]]:
    out = {}
    for topo, source in topologies(scratch).items():
        for profile in PROFILES:
            for vcpus, memory in SIZES:
                for fmt in FORMATS:
                    args = ["plan", "--profile", profile, "--vcpus", vcpus, "--memory", memory]
                    out[f"{topo} {profile} {vcpus}x{memory} {fmt}"] = [
                        *args, "--accel", "tcg", "--format", fmt, *source,
                    ]  # fmt: skip
    return out


def dump(src: Path, case_file: Path, result: Path) -> dict[str, list[object]]:
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    subprocess.run([sys.executable, "-c", DUMP, str(case_file), str(result)], env=env, check=True)
    data: dict[str, list[object]] = json.loads(result.read_text())
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="git revision to compare with")
    ref = parser.parse_args().ref
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        tree = scratch / "tree"
        tree.mkdir()
        # git archive, not a worktree: nothing is written into the repository
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "src"],
                                 check=True, capture_output=True)  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        case_file = scratch / "cases.json"
        case_file.write_text(json.dumps(cases(scratch / "sysfs")))
        before = dump(tree / "src", case_file, scratch / "before.json")
        after = dump(REPO / "src", case_file, scratch / "after.json")
    differ = sorted(k for k in before if before[k] != after.get(k))
    refused = sum(1 for v in after.values() if v[0] != 0)
    print(f"{len(before)} cases ({refused} refused by the planner, compared as refusals too)")
    for key in differ:
        print(f"DIFFERS: {key}")
    print(f"{len(differ)} of {len(before)} outputs differ from {ref}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
