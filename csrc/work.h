/* The unit of work both C helpers time: hpcvm-noise's quantum, and hpcvm-bsp's grain
 * between allreduces, must be the very same code so that a grain is a whole number of
 * quanta of the same work (docs/scale.md).  Included, not linked: each helper is one
 * compiler call in the Makefile. */
#ifndef HPCVM_WORK_H
#define HPCVM_WORK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A serial chain of integer multiply-adds.  The empty asm statement tells the compiler
 * the value is used and changed on every iteration, so it can neither drop the loop nor
 * collapse or vectorise it; the chain's dependency makes each iteration take the same
 * few cycles on any x86-64. */
static uint64_t __attribute__((noinline, unused)) work(uint64_t iterations, uint64_t seed)
{
    uint64_t x = seed;
    for (uint64_t i = 0; i < iterations; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}

#endif
