/*
 * hpcvm-noise: a fixed-work-quantum (FWQ) noise benchmark.
 *
 * One worker thread per CPU, each pinned to its CPU, repeats the same small piece of
 * work (a "quantum", calibrated once at start to a target duration) N times and
 * records how long each repetition took, timestamped back to back with
 * clock_gettime(CLOCK_MONOTONIC).  On a perfectly quiet CPU every quantum takes the
 * same time; anything above the fastest one (a "detour") is time the OS or the
 * hypervisor took away: interrupts, timer ticks, kernel threads, VM exits.
 *
 * Output on stdout, one line of key=value pairs for the run and one per CPU:
 *   hpcvm-noise version=1 cpus=0,1 quanta=20000 iterations=... target_ns=... quantum_ns=...
 *   cpu=0 count=20000 min_ns=... median_ns=... max_detour_ns=... p999_detour_ns=...
 *         lost_fraction=... total_ns=...
 * detour = duration - min (per CPU); p999 is the nearest-rank 99.9th percentile of the
 * detours; lost_fraction = sum(detours) / sum(durations).
 *
 * With -o FILE the raw durations are written as text, one line per CPU:
 *   cpu=<id> <ns> <ns> ...
 *
 * Built for baseline x86-64 on purpose (see Makefile): the same binary runs natively
 * and inside TCG guests whose CPU model lacks the host's AVX-512.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "work.h"

#define NOISE_VERSION 1
#define MAX_CPUS CPU_SETSIZE

struct worker {
    pthread_t thread;
    int cpu;
    uint64_t *durations; /* ns, one per quantum */
    int error;           /* errno of a failed pin, 0 if pinned */
    uint64_t result;     /* the work's final value, so it cannot be optimised away */
};

static uint64_t g_iterations;    /* work loop length of one quantum */
static long g_quanta;            /* quanta per CPU */
static pthread_barrier_t g_start;
static volatile uint64_t g_sink; /* keeps calibration's results alive (main thread only) */

static uint64_t min_time_ns(uint64_t iterations, int repeats)
{
    uint64_t best = UINT64_MAX;
    for (int r = 0; r < repeats; r++) {
        uint64_t t0 = now_ns();
        g_sink += work(iterations, (uint64_t)r);
        uint64_t dt = now_ns() - t0;
        if (dt < best)
            best = dt;
    }
    return best;
}

/* Find the loop length whose fastest run takes target_ns: grow until the run is long
 * enough to time well, then scale linearly and refine once. */
static uint64_t calibrate(uint64_t target_ns)
{
    uint64_t iterations = 64;
    uint64_t t = min_time_ns(iterations, 5);
    while (t < target_ns / 4 && iterations < (UINT64_C(1) << 40)) {
        iterations *= 2;
        t = min_time_ns(iterations, 5);
    }
    for (int round = 0; round < 2; round++) {
        if (t == 0)
            t = 1;
        iterations = iterations * target_ns / t;
        if (iterations == 0)
            iterations = 1;
        t = min_time_ns(iterations, 11);
    }
    return iterations;
}

static int pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        return errno;
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    w->error = pin_self(w->cpu);
    pthread_barrier_wait(&g_start);
    if (w->error)
        return NULL;
    uint64_t seed = (uint64_t)w->cpu;
    uint64_t prev = now_ns();
    for (long i = 0; i < g_quanta; i++) {
        seed = work(g_iterations, seed);
        uint64_t t = now_ns();
        w->durations[i] = t - prev;
        prev = t;
    }
    w->result = seed;
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int print_cpu_summary(const struct worker *w)
{
    size_t n = (size_t)g_quanta;
    uint64_t *sorted = malloc(n * sizeof(*sorted));
    if (!sorted)
        return -1;
    memcpy(sorted, w->durations, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_u64);
    uint64_t min = sorted[0];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += sorted[i];
    uint64_t lost = total - min * (uint64_t)n;
    size_t rank999 = (n * 999 + 999) / 1000; /* ceil(0.999 n), nearest rank */
    if (rank999 < 1)
        rank999 = 1;
    printf("cpu=%d count=%zu min_ns=%" PRIu64 " median_ns=%" PRIu64 " max_detour_ns=%" PRIu64
           " p999_detour_ns=%" PRIu64 " lost_fraction=%.9f total_ns=%" PRIu64 "\n",
           w->cpu, n, min, sorted[(n - 1) / 2], sorted[n - 1] - min, sorted[rank999 - 1] - min,
           total ? (double)lost / (double)total : 0.0, total);
    free(sorted);
    return 0;
}

static int write_raw(const char *path, const struct worker *workers, int nworkers)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "hpcvm-noise: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (int k = 0; k < nworkers; k++) {
        fprintf(f, "cpu=%d", workers[k].cpu);
        for (long i = 0; i < g_quanta; i++)
            fprintf(f, " %" PRIu64, workers[k].durations[i]);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "hpcvm-noise: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Parse a kernel-style CPU list ("0-3,8") into cpus[]; returns the count or -1. */
static int parse_cpu_list(const char *text, int *cpus)
{
    int count = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10);
        if (end == p || lo < 0 || lo >= MAX_CPUS)
            return -1;
        long hi = lo;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo || hi >= MAX_CPUS)
                return -1;
            p = end;
        }
        for (long c = lo; c <= hi; c++) {
            if (count >= MAX_CPUS)
                return -1;
            cpus[count++] = (int)c;
        }
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return count;
}

static int allowed_cpus(int *cpus)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return -1;
    int count = 0;
    for (int c = 0; c < MAX_CPUS; c++)
        if (CPU_ISSET(c, &set))
            cpus[count++] = c;
    return count;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hpcvm-noise [-n QUANTA] [-q QUANTUM_US] [-i ITERATIONS] [-c CPULIST] "
            "[-o RAWFILE]\n"
            "  -n QUANTA      quanta per CPU (default 20000)\n"
            "  -q QUANTUM_US  target duration of one quantum in microseconds (default 50)\n"
            "  -i ITERATIONS  fixed work loop length instead of calibrating\n"
            "  -c CPULIST     CPUs to run on, e.g. 0-3,8 (default: all allowed CPUs)\n"
            "  -o RAWFILE     write every duration (ns), one line per CPU\n");
}

static int parse_positive(const char *text, const char *what, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v <= 0 || v > max) {
        fprintf(stderr, "hpcvm-noise: %s must be a whole number in 1..%lld, got '%s'\n", what,
                max, text);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    long long quanta = 20000, quantum_us = 50, fixed_iterations = 0;
    const char *cpu_list = NULL, *raw_path = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "n:q:i:c:o:h")) != -1) {
        switch (opt) {
        case 'n':
            if (parse_positive(optarg, "-n QUANTA", 100000000, &quanta))
                return 2;
            break;
        case 'q':
            if (parse_positive(optarg, "-q QUANTUM_US", 10000000, &quantum_us))
                return 2;
            break;
        case 'i':
            if (parse_positive(optarg, "-i ITERATIONS", (long long)1 << 40, &fixed_iterations))
                return 2;
            break;
        case 'c':
            cpu_list = optarg;
            break;
        case 'o':
            raw_path = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "hpcvm-noise: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    static int cpus[MAX_CPUS];
    int ncpus = cpu_list ? parse_cpu_list(cpu_list, cpus) : allowed_cpus(cpus);
    if (ncpus <= 0) {
        fprintf(stderr, "hpcvm-noise: bad or empty CPU list '%s'\n", cpu_list ? cpu_list : "");
        return 2;
    }
    g_quanta = (long)quanta;

    /* Calibrate on the first CPU, so the quantum is one length for every worker. */
    int err = pin_self(cpus[0]);
    if (err) {
        fprintf(stderr, "hpcvm-noise: cannot run on CPU %d: %s\n", cpus[0], strerror(err));
        return 1;
    }
    uint64_t target_ns = (uint64_t)quantum_us * 1000u;
    g_iterations = fixed_iterations ? (uint64_t)fixed_iterations : calibrate(target_ns);
    uint64_t quantum_ns = min_time_ns(g_iterations, 11);

    struct worker *workers = calloc((size_t)ncpus, sizeof(*workers));
    if (!workers) {
        fprintf(stderr, "hpcvm-noise: out of memory\n");
        return 1;
    }
    for (int k = 0; k < ncpus; k++) {
        workers[k].cpu = cpus[k];
        workers[k].durations = calloc((size_t)g_quanta, sizeof(uint64_t));
        if (!workers[k].durations) {
            fprintf(stderr, "hpcvm-noise: out of memory for %lld quanta\n", quanta);
            return 1;
        }
    }
    if (pthread_barrier_init(&g_start, NULL, (unsigned)ncpus) != 0) {
        fprintf(stderr, "hpcvm-noise: cannot create barrier\n");
        return 1;
    }
    for (int k = 0; k < ncpus; k++) {
        err = pthread_create(&workers[k].thread, NULL, worker_main, &workers[k]);
        if (err) {
            fprintf(stderr, "hpcvm-noise: cannot start thread: %s\n", strerror(err));
            return 1;
        }
    }
    int failed = 0;
    for (int k = 0; k < ncpus; k++) {
        pthread_join(workers[k].thread, NULL);
        if (workers[k].error) {
            fprintf(stderr, "hpcvm-noise: cannot run on CPU %d: %s\n", workers[k].cpu,
                    strerror(workers[k].error));
            failed = 1;
        }
    }
    if (failed)
        return 1;
    for (int k = 0; k < ncpus; k++)
        g_sink += workers[k].result;

    printf("hpcvm-noise version=%d cpus=", NOISE_VERSION);
    for (int k = 0; k < ncpus; k++)
        printf("%s%d", k ? "," : "", cpus[k]);
    printf(" quanta=%ld iterations=%" PRIu64 " target_ns=%" PRIu64 " quantum_ns=%" PRIu64 "\n",
           g_quanta, g_iterations, target_ns, quantum_ns);
    for (int k = 0; k < ncpus; k++)
        if (print_cpu_summary(&workers[k]) != 0) {
            fprintf(stderr, "hpcvm-noise: out of memory\n");
            return 1;
        }
    if (raw_path && write_raw(raw_path, workers, ncpus) != 0)
        return 1;
    for (int k = 0; k < ncpus; k++)
        free(workers[k].durations);
    free(workers);
    return fflush(stdout) == 0 ? 0 : 1;
}
