"""Reading a rendered QEMU argv back, independently of the renderer's own helpers.

QEMU's ``key=value,...`` syntax doubles a comma inside a value; an option's first
element may be an implied value without ``key=`` (``-smp 4,sockets=2``, ``-object
memory-backend-ram,id=m0``). Sizes take binary suffixes; ``-m`` without one is MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: QEMU options that take no argument (everything else used by the renderer takes one).
FLAGS = frozenset({"-nodefaults", "-no-user-config", "-S", "-daemonize"})
_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass
class Opts:
    """One parsed option value: the implied head and the key=value pairs in order."""

    head: str | None
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        values = self.all(key)
        assert len(values) <= 1, f"{key} given {len(values)} times"
        return values[0] if values else None

    def all(self, key: str) -> list[str]:
        return [v for k, v in self.pairs if k == key]

    def keys(self) -> list[str]:
        return [k for k, _ in self.pairs]


def split_opts(text: str) -> list[str]:
    """Split on single commas; ``,,`` is a literal comma."""
    parts: list[str] = []
    current = ""
    i = 0
    while i < len(text):
        if text[i] == ",":
            if text[i + 1 : i + 2] == ",":
                current += ","
                i += 2
                continue
            parts.append(current)
            current = ""
        else:
            current += text[i]
        i += 1
    parts.append(current)
    return parts


def parse_opts(text: str) -> Opts:
    parts = split_opts(text)
    head = None if "=" in parts[0] else parts[0]
    pairs = [tuple(p.split("=", 1)) for p in (parts[1:] if head is not None else parts)]
    return Opts(head, [(k, v) for k, v in pairs])


def group_argv(argv: list[str]) -> list[tuple[str, str | None]]:
    """argv[1:] as (option, value) pairs; flags get None. Fails on a stray word."""
    out: list[tuple[str, str | None]] = []
    i = 1
    while i < len(argv):
        option = argv[i]
        assert option.startswith("-"), f"stray argument {option!r} at {i}"
        if option in FLAGS:
            out.append((option, None))
            i += 1
        else:
            out.append((option, argv[i + 1]))
            i += 2
    return out


def values(argv: list[str], option: str) -> list[str]:
    return [v for o, v in group_argv(argv) if o == option and v is not None]


def size(text: str, default_unit: str = "") -> int:
    """QEMU's size syntax: ``512M``, ``2G``, ``1073741824``; ``-m`` defaults to M."""
    number = text.rstrip("BKMGTbkmgt")
    unit = text[len(number) :].upper() or default_unit
    return int(number) * _SUFFIX[unit]


def objects(argv: list[str], qom_type: str) -> dict[str, Opts]:
    """``-object`` values of one type by id."""
    found = {}
    for value in values(argv, "-object"):
        o = parse_opts(value)
        if o.head == qom_type:
            ident = o.get("id")
            assert ident is not None
            found[ident] = o
    return found


def numa(argv: list[str], kind: str) -> list[Opts]:
    return [o for o in map(parse_opts, values(argv, "-numa")) if o.head == kind]


def distance_matrix(argv: list[str], nodes: int) -> list[list[int]]:
    """The matrix QEMU builds from ``-numa dist``: local 10, a missing reverse direction
    mirrored (QEMU's rule for a symmetric input)."""
    given = {
        (int(o.get("src") or -1), int(o.get("dst") or -1)): int(o.get("val") or -1)
        for o in numa(argv, "dist")
    }
    matrix = [[10 if i == j else 0 for j in range(nodes)] for i in range(nodes)]
    for (i, j), val in given.items():
        matrix[i][j] = val
        if (j, i) not in given:
            matrix[j][i] = val
    return matrix
