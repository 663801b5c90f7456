/*
 * The thread count of a call (fastln.h's "Threads"): the count requested,
 * else the default, else OpenMP's; one thread in a child forked after the
 * library loaded.
 */
#include "api/fastln.h"
#include "runtime/runtime.h"
#if defined(_OPENMP) && defined(__unix__)
#include <pthread.h>
#endif

static int g_num_threads = 0;   /* from fastln_set_num_threads; 0: the default */
static int g_default = 0;       /* from fastln_set_default_threads; 0: OpenMP's default */
static int g_initial_max = 0;   /* omp_get_max_threads() when the library was loaded */
static int g_forked = 0;        /* 1 in a child forked from the process that loaded us */

/* libgomp cannot restart its thread pool in a forked child: a parallel region
 * there waits for the parent's workers forever. A child runs serially. */
static void on_fork_child(void) { g_forked = 1; }

#if defined(__GNUC__) || defined(__clang__)
__attribute__((constructor)) static void at_load(void)
{
    g_initial_max = omp_get_max_threads();
#if defined(_OPENMP) && defined(__unix__)
    pthread_atfork(NULL, NULL, on_fork_child);
#else
    (void)on_fork_child;
#endif
}
#endif

int fastln_has_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

void fastln_set_num_threads(int n)
{
    __atomic_store_n(&g_num_threads, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

int fastln_get_requested_threads(void)
{
    return __atomic_load_n(&g_num_threads, __ATOMIC_RELAXED);
}

void fastln_set_default_threads(int n)
{
    __atomic_store_n(&g_default, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

int fastln_get_num_threads(void)
{
    if (__atomic_load_n(&g_forked, __ATOMIC_RELAXED)) return 1;
    int m = omp_get_max_threads(), n = __atomic_load_n(&g_num_threads, __ATOMIC_RELAXED);
    if (n <= 0) {
        /* OpenMP's count where someone changed it on this thread since load
         * (threadpoolctl, omp_set_num_threads), else the machine's default */
        int d = __atomic_load_n(&g_default, __ATOMIC_RELAXED);
        return m != g_initial_max || d <= 0 || d > m ? m : d;
    }
    /* a limit set on this thread after load (threadpoolctl, omp_set_num_threads) caps it */
    return m < g_initial_max && m < n ? m : n;
}
