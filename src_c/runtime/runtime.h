/*
 * runtime/: what the kernels run on, the same for every instruction-set path:
 *   runtime.h   OpenMP or its serial stand-ins, teams of threads (ON_TEAM),
 *               aligned scratch, and the default thread count
 *   threads.c   the thread count of a call (fastln.h's "Threads")
 *   policy.h/c  the run-time policy: cache sizes, and each call's threads,
 *               streaming stores and tiling
 *   pool.h/c    the cache of large buffers (the Python layer's outputs, the
 *               recurrent engine's packed weights)
 * runtime/ includes the C library and the public headers (api/fastln.h)
 * only; policy.h and pool.h include nothing of fastln, so that the Python
 * layer and the C tests can use them alone.
 */
#ifndef FASTLN_RUNTIME_H
#define FASTLN_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
static inline void omp_set_num_threads(int n) { (void)n; }
#endif

/* Runs the statements on a team of nt threads, or directly when nt == 1: an
 * OpenMP region costs time to set up even for one thread, which matters to
 * a step of the recurrent engine. The orphaned omp for/single/barrier
 * constructs in the statements bind to the team, or run serially without
 * one. */
#define ON_TEAM(nt, ...)                                  \
    do {                                                  \
        if ((nt) > 1) {                                   \
            _Pragma("omp parallel num_threads(nt)") { __VA_ARGS__ } \
        } else {                                          \
            __VA_ARGS__                                   \
        }                                                 \
    } while (0)

/* p rounded up to a multiple of 64 bytes (a block allocated with 64 bytes to
 * spare): vectors and AMX tile rows read from there are whole cache lines */
static inline void *fastln_align64(void *p) { return (char *)p + (-(uintptr_t)p & 63); }

/* The default thread count where none is set and OpenMP's is unchanged
 * since load; 0: OpenMP's (threads.c). */
void fastln_set_default_threads(int n);

#endif
