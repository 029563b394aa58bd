"""What a hung run's failure record shows of the ranks' own stderr (bench/envs/mpiwatch.py)."""

from __future__ import annotations

from hpcvm.bench.envs.mpiwatch import rank_lines

# mpirun's stderr as measured (Open MPI 4.1.4): a binding report, the rank's own line,
# then two boxed notices.
STDERR = """[vm:11704] MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]
rank1: cannot open input deck
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun.openmpi detected that one or more processes exited with non-zero status, thus causing
  Exit code:    3
--------------------------------------------------------------------------
"""


def test_rank_lines_keep_the_ranks_words_and_drop_mpiruns() -> None:
    assert rank_lines(STDERR) == "rank1: cannot open input deck"


def test_rank_lines_keep_the_last_few() -> None:
    assert rank_lines("a\nb\nc\nd\n", lines=2) == "c | d"
    assert rank_lines("") == ""
