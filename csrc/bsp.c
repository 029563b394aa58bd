/*
 * hpcvm-bsp: a bulk-synchronous microbenchmark.  Every MPI rank repeats a step: a fixed
 * grain of work (the same serial multiply-add chain as hpcvm-noise, so one grain is
 * ITERATIONS of noise's work loop) followed by an MPI_Allreduce of one double.  A step
 * ends for everyone when the slowest rank has finished its grain, so one rank's detour
 * delays them all: the effect hpcvm's scale prediction models (docs/scale.md).
 *
 * Usage: hpcvm-bsp -s STEPS -i ITERATIONS [-o FILE]
 *
 * Each rank times its grain and its whole step (grain + allreduce) with
 * clock_gettime(CLOCK_MONOTONIC) in every step; rank 0 gathers them at the end.
 * stdout (rank 0), one line:
 *   hpcvm-bsp version=1 ranks=2 steps=2000 iterations=... grain_min_ns=... step_mean_ns=...
 * With -o FILE (rank 0 writes it), two lines per rank:
 *   grain rank=<r> <ns> <ns> ...     each step's grain (work only)
 *   step rank=<r> <ns> <ns> ...      each step's grain plus its allreduce
 * The slowdown is computed from these in Python (hpcvm.bench.suites.bsp.suite), not here.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "work.h"

#define BSP_VERSION 1
#define WARMUP_STEPS 10

static void usage(void)
{
    fprintf(stderr, "usage: hpcvm-bsp -s STEPS -i ITERATIONS [-o FILE]\n");
}

static int write_rows(FILE *f, const char *what, const uint64_t *all, int ranks, long steps)
{
    for (int r = 0; r < ranks; r++) {
        fprintf(f, "%s rank=%d", what, r);
        for (long s = 0; s < steps; s++)
            fprintf(f, " %" PRIu64, all[(size_t)r * (size_t)steps + (size_t)s]);
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

static int write_raw(const char *path, const uint64_t *grains, const uint64_t *steps_ns,
                     int ranks, long steps)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    int bad = write_rows(f, "grain", grains, ranks, steps);
    bad |= write_rows(f, "step", steps_ns, ranks, steps);
    if (fclose(f) != 0 || bad) {
        perror(path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    long steps = 0;
    unsigned long long iterations = 0;
    const char *out = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "s:i:o:")) != -1) {
        switch (opt) {
        case 's': steps = strtol(optarg, NULL, 10); break;
        case 'i': iterations = strtoull(optarg, NULL, 10); break;
        case 'o': out = optarg; break;
        default: usage(); return 2;
        }
    }
    if (steps < 1 || iterations < 1) {
        usage();
        return 2;
    }
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    uint64_t *grain = calloc((size_t)steps, sizeof *grain);
    uint64_t *step = calloc((size_t)steps, sizeof *step);
    if (grain == NULL || step == NULL) {
        fprintf(stderr, "hpcvm-bsp: out of memory for %ld steps\n", steps);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double value = 1.0, sum = 0.0;
    uint64_t sink = 0;
    for (long s = -WARMUP_STEPS; s < steps; s++) {
        uint64_t t0 = now_ns();
        sink += work(iterations, (uint64_t)s);
        uint64_t t1 = now_ns();
        MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        uint64_t t2 = now_ns();
        if (s >= 0) {
            grain[s] = t1 - t0;
            step[s] = t2 - t0;
        }
    }
    uint64_t *grains = NULL, *steps_ns = NULL;
    if (rank == 0) {
        grains = calloc((size_t)steps * (size_t)ranks, sizeof *grains);
        steps_ns = calloc((size_t)steps * (size_t)ranks, sizeof *steps_ns);
        if (grains == NULL || steps_ns == NULL) {
            fprintf(stderr, "hpcvm-bsp: out of memory gathering %d ranks\n", ranks);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Gather(grain, (int)steps, MPI_UINT64_T, grains, (int)steps, MPI_UINT64_T, 0,
               MPI_COMM_WORLD);
    MPI_Gather(step, (int)steps, MPI_UINT64_T, steps_ns, (int)steps, MPI_UINT64_T, 0,
               MPI_COMM_WORLD);
    int status = 0;
    if (rank == 0) {
        uint64_t low = UINT64_MAX;
        double total = 0.0;
        for (size_t k = 0; k < (size_t)steps * (size_t)ranks; k++)
            if (grains[k] < low)
                low = grains[k];
        for (long s = 0; s < steps; s++)
            total += (double)steps_ns[s];
        printf("hpcvm-bsp version=%d ranks=%d steps=%ld iterations=%llu grain_min_ns=%" PRIu64
               " step_mean_ns=%.0f sink=%" PRIu64 "\n",
               BSP_VERSION, ranks, steps, iterations, low, total / (double)steps,
               (uint64_t)(sink & 1u));
        if (out != NULL && write_raw(out, grains, steps_ns, ranks, steps) != 0)
            status = 1;
    }
    free(grain);
    free(step);
    free(grains);
    free(steps_ns);
    MPI_Finalize();
    return status;
}
