/* The cache of large output buffers declared in pool.h.
 *
 * A block is one allocation: a 64-byte header holding its capacity, then the
 * caller's bytes (so the caller's pointer stays 64-byte aligned and a block
 * can be freed or resized without knowing its size). The cache is a short
 * list of kept blocks, oldest first, under a try-lock; blocks are allocated
 * and released outside it. */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE   /* posix_memalign, and madvise's MADV_HUGEPAGE, under -std=c99 */
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include "runtime/pool.h"

#define HEAD 64                            /* header bytes before the caller's */
#define SLOTS 8                            /* kept blocks, at most */

typedef struct {
    size_t cap;     /* the caller's bytes this block holds */
} head_t;

static void *g_blk[SLOTS];      /* kept blocks (their headers), oldest first */
static int g_nblk;
static size_t g_bytes;          /* their capacities summed */
static size_t g_limit = FASTLN_POOL_DEFAULT_LIMIT;
static size_t g_hits, g_misses;   /* g_misses: also counted without the lock (atomic) */
static int g_lock;

static int try_lock(void) { return !__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE); }
static void lock(void) { while (!try_lock()) { /* held for a few list operations only */ } }
static void unlock(void) { __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE); }

static head_t *head_of(void *p) { return (head_t *)((char *)p - HEAD); }

/* A block of cap bytes serves a request of n: large enough, and at most
 * 1/8 larger */
static int fits(size_t cap, size_t n) { return cap >= n && cap - n <= n / 8; }

/* A new block of cap bytes (plus its header), or NULL */
static void *block_new(size_t cap)
{
    void *b = NULL;
    if (cap > SIZE_MAX - HEAD || posix_memalign(&b, HEAD, HEAD + cap)) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (cap >= FASTLN_POOL_MIN_BYTES) {   /* transparent huge pages, as NumPy asks for */
        uintptr_t a = ((uintptr_t)b + 4095) & ~(uintptr_t)4095;
        uintptr_t e = ((uintptr_t)b + HEAD + cap) & ~(uintptr_t)4095;
        if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);
    }
#endif
    ((head_t *)b)->cap = cap;
    return b;
}

/* Releases the blocks in b[0 .. n) */
static void release_all(void **b, int n)
{
    for (int i = 0; i < n; i++) free(b[i]);
}

/* Drops kept blocks, oldest first, until `room` more bytes fit under the
 * limit and a slot is free (room 0 and want_slot 0: until within the limit),
 * moving them to out; returns how many. Called with the lock held. */
static int evict(size_t room, int want_slot, void **out)
{
    int k = 0;
    while (g_nblk > 0 && (g_bytes + room > g_limit || (want_slot && g_nblk == SLOTS))) {
        out[k++] = g_blk[0];
        g_bytes -= ((head_t *)g_blk[0])->cap;
        memmove(g_blk, g_blk + 1, (size_t)(--g_nblk) * sizeof(void *));
    }
    return k;
}

void *fastln_pool_alloc(size_t nbytes)
{
    if (nbytes == 0) nbytes = 1;
    if (nbytes >= FASTLN_POOL_MIN_BYTES) {
        void *b = NULL;
        if (try_lock()) {
            int best = -1;   /* the smallest kept block that fits within 1/8 */
            for (int i = 0; i < g_nblk; i++) {
                size_t cap = ((head_t *)g_blk[i])->cap;
                if (fits(cap, nbytes) && (best < 0 || cap < ((head_t *)g_blk[best])->cap))
                    best = i;
            }
            if (best >= 0) {
                b = g_blk[best];
                g_bytes -= ((head_t *)b)->cap;
                memmove(g_blk + best, g_blk + best + 1,
                        (size_t)(g_nblk - best - 1) * sizeof(void *));
                g_nblk--;
                g_hits++;
            }
            unlock();
        }
        if (b) return (char *)b + HEAD;
        __atomic_fetch_add(&g_misses, 1, __ATOMIC_RELAXED);   /* the lock not needed */
    }
    /* pages, for blocks the cache may keep; 64 bytes for the others */
    size_t cap = nbytes >= FASTLN_POOL_MIN_BYTES ? (nbytes + 4095) & ~(size_t)4095
                                                 : (nbytes + 63) & ~(size_t)63;
    if (cap < nbytes) return NULL;   /* wrapped around */
    void *b = block_new(cap);
    return b ? (char *)b + HEAD : NULL;
}

void *fastln_pool_calloc(size_t nbytes)
{
    void *p = fastln_pool_alloc(nbytes);
    if (p) memset(p, 0, nbytes ? nbytes : 1);
    return p;
}

void fastln_pool_free(void *p)
{
    if (!p) return;
    head_t *h = head_of(p);
    void *gone[SLOTS + 1];
    int n = 0;
    if (h->cap >= FASTLN_POOL_MIN_BYTES && try_lock()) {
        if (h->cap <= g_limit) {
            n = evict(h->cap, 1, gone);
            g_blk[g_nblk++] = h;
            g_bytes += h->cap;
            h = NULL;
        }
        unlock();
    }
    if (h) gone[n++] = h;
    release_all(gone, n);
}

void *fastln_pool_realloc(void *p, size_t nbytes)
{
    if (!p) return fastln_pool_alloc(nbytes);
    size_t old = head_of(p)->cap;
    if (old < FASTLN_POOL_MIN_BYTES ? nbytes <= old : fits(old, nbytes))
        return p;   /* it fits (and a block the cache may keep wastes little) */
    void *q = fastln_pool_alloc(nbytes);
    if (!q) return NULL;
    memcpy(q, p, old < nbytes ? old : nbytes);
    fastln_pool_free(p);
    return q;
}

void fastln_pool_set_limit(size_t bytes)
{
    void *gone[SLOTS];
    lock();
    g_limit = bytes;
    int n = evict(0, 0, gone);
    unlock();
    release_all(gone, n);
}

void fastln_pool_release(void)
{
    void *gone[SLOTS];
    lock();
    int n = g_nblk;
    memcpy(gone, g_blk, (size_t)n * sizeof(void *));
    g_nblk = 0;
    g_bytes = 0;
    unlock();
    release_all(gone, n);
}

void fastln_pool_get_stats(fastln_pool_stats *s)
{
    lock();
    s->limit = g_limit;
    s->bytes = g_bytes;
    s->blocks = (size_t)g_nblk;
    s->hits = g_hits;
    s->misses = __atomic_load_n(&g_misses, __ATOMIC_RELAXED);
    unlock();
}
