"""What hpcvm knows about the NPB kernels: which it runs, on how many processes, and
which problem class a ``--size`` picks.

Pure data and pure functions (no I/O), so the choices are tested without NPB binaries.

Classes: NPB sizes every kernel by a class letter, S (sample, fractions of a second
natively) < W (workstation) < A < B < C < D < E < F, each step several times the
work of the one before. ``bench --size`` is hpcvm's one size knob for all suites;
for NPB it picks the class a plain kernel name (``cg``) runs:

=========  =====  ======================================================
--size     class  why
=========  =====  ======================================================
quick      S      a smoke test: well under a second natively, seconds
                  under TCG; too short for NPB's 0.01 s timer (use Mop/s)
small      W      the default: about 0.1-1 s natively per kernel
medium     A      the smallest class of published results (seconds
                  natively, minutes under TCG)
=========  =====  ======================================================

Larger classes (B and up) are named explicitly (``cg.B``): they take minutes natively
and far longer in an emulated guest, which should never happen by default.
A memory fraction (``--size 0.05``) sizes HPL only and picks no NPB class.

Process counts: NPB decomposes each kernel's data in a fixed way. BT and SP need a
square number of processes, CG, FT, IS and MG a power of two: in 3.3 ``setparams``
refuses other counts at build time; in 3.4 the count is checked at run time, and
3.4.0 runs BT/SP on the largest square below it (idling the rest: a run labelled np 2
that used one process) and FT without verification, while 3.4.1 and later abort with
``*** ERROR determining processor topology``. hpcvm refuses such counts before
anything runs. EP takes any count; LU takes an nx*ny grid whose rule changed between
versions, so hpcvm leaves it to the binary (whose error line becomes the failed
sample's reason).
"""

from __future__ import annotations

import math
from typing import Literal

from hpcvm.errors import UsageError

ProcessRule = Literal["any", "square", "power-of-two"]

CLASSES = ("S", "W", "A", "B", "C", "D", "E", "F")

# kernel -> (full name, process rule). The MPI kernels hpcvm runs.
KERNELS: dict[str, tuple[str, ProcessRule]] = {
    "bt": ("Block Tri-diagonal solver", "square"),
    "cg": ("Conjugate Gradient", "power-of-two"),
    "ep": ("Embarrassingly Parallel", "any"),
    "ft": ("3-D Fast Fourier Transform", "power-of-two"),
    "is": ("Integer Sort", "power-of-two"),
    "lu": ("Lower-Upper Gauss-Seidel solver", "any"),
    "mg": ("Multi-Grid", "power-of-two"),
    "sp": ("Scalar Penta-diagonal solver", "square"),
}

# NPB programs hpcvm refuses, and why (said to the user in one line).
NOT_RUN: dict[str, str] = {
    "dt": (
        "NPB DT (data traffic) is not run by hpcvm: it needs a communication-graph argument "
        "(BH, WH or SH) and at least as many processes as the graph has nodes, and it "
        "times a graph's message flow rather than a numerical kernel"
    ),
}

CLASS_BY_SIZE: dict[str, str] = {"quick": "S", "small": "W", "medium": "A"}


def class_for_size(size: str | float) -> str:
    """The NPB class that ``--size`` picks for a plain kernel name (table above)."""
    if isinstance(size, str) and size in CLASS_BY_SIZE:
        return CLASS_BY_SIZE[size]
    sizes = ", ".join(f"{name} ({klass})" for name, klass in CLASS_BY_SIZE.items())
    raise UsageError(
        f"--size {size} picks no NPB class: use --size {sizes}, or name the class "
        f"(--npb-kernels cg.B)"
    )


def larger_class(klass: str) -> str | None:
    """The next NPB class up (``S`` -> ``W``), None above F."""
    index = CLASSES.index(klass)
    return CLASSES[index + 1] if index + 1 < len(CLASSES) else None


def _largest_fitting(rule: ProcessRule, np: int) -> int:
    if rule == "square":
        return math.isqrt(np) ** 2
    if rule == "power-of-two":
        return 1 << (np.bit_length() - 1)
    return np


def check_process_count(kernel: str, np: int) -> None:
    """UsageError when ``kernel`` cannot run on exactly ``np`` processes."""
    name, rule = KERNELS[kernel]
    fitting = _largest_fitting(rule, np)
    if fitting != np:
        raise UsageError(
            f"NPB {kernel.upper()} ({name}) needs a {rule} number of processes, not "
            f"--np {np}: use e.g. --np {fitting}"
        )


def parse_selector(text: str) -> tuple[str, str | None]:
    """``cg`` -> (cg, None), ``CG.a`` -> (cg, A); UsageError for anything else, and for
    the programs hpcvm does not run (with the reason)."""
    kernel, _, klass = text.strip().lower().partition(".")
    if kernel in NOT_RUN:
        raise UsageError(NOT_RUN[kernel])
    if kernel not in KERNELS:
        raise UsageError(
            f"unknown NPB kernel {text!r}: choose from {', '.join(KERNELS)} "
            f"(optionally with a class, e.g. cg.A)"
        )
    if not klass:
        return kernel, None
    if klass.upper() not in CLASSES:
        raise UsageError(
            f"unknown NPB class in {text!r}: classes are {', '.join(CLASSES)} (e.g. cg.A)"
        )
    return kernel, klass.upper()
