/*
 * The run-time policy (policy.h): cache sizes, read once, and the plan of a
 * call derived from them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif
#include "runtime/policy.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#if defined(__GNUC__) || defined(__clang__)
#include <cpuid.h>
#define POLICY_CPUID 1
#endif
#endif

/* ---- reading the cache sizes ---- */

/* The C locale's white space, whatever the process's locale */
static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Letters of the suffix, in either case */
static int is_letter(char c, char lower) { return c == lower || c == lower - 'a' + 'A'; }

double fastln_parse_bytes(const char *s)
{
    if (!s) return -1;
    while (is_space(*s)) s++;
    if (!is_digit(*s)) return -1;
    double v = 0;   /* digits only: no sign, point, exponent or base prefix */
    for (; is_digit(*s); s++)
        if (v <= FASTLN_MAX_BYTES) v = v * 10 + (*s - '0');   /* past the cap, stays past it */
    double unit = 1;
    if (is_letter(*s, 'k')) unit = 1024.0;
    else if (is_letter(*s, 'm')) unit = 1024.0 * 1024;
    else if (is_letter(*s, 'g')) unit = 1024.0 * 1024 * 1024;
    if (unit > 1) {
        s++;
        if (is_letter(s[0], 'i') && is_letter(s[1], 'b')) s += 2;
        else if (is_letter(s[0], 'b')) s++;
    } else if (is_letter(*s, 'b')) {
        s++;
    }
    while (is_space(*s)) s++;
    if (*s != '\0') return -1;
    v *= unit;
    return v <= FASTLN_MAX_BYTES ? v : -1;
}

/* sysconf's size of a level (glibc), or 0 */
static double from_sysconf(int level)
{
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && \
    defined(_SC_LEVEL3_CACHE_SIZE)
    const int name[3] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE};
    long v = sysconf(name[level - 1]);
    return v > 0 ? (double)v : 0;
#else
    (void)level;
    return 0;
#endif
}

/* One line of file dir/index<i>/name into buf, without its newline; 0 if unreadable */
static int read_line(char *buf, size_t n, const char *dir, int i, const char *name)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/index%d/%s", dir, i, name) >= (int)sizeof path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\r\n")] = '\0';
    return ok;
}

/* sizes[1..3] from the sysfs cache directory dir: the data or unified cache of each level */
static void from_sysfs(double sizes[4], const char *dir)
{
    for (int i = 0; i < 32; i++) {
        char level[32], type[32], size[64];
        if (!read_line(level, sizeof level, dir, i, "level")) continue;
        if (!read_line(type, sizeof type, dir, i, "type")) continue;
        if (!read_line(size, sizeof size, dir, i, "size")) continue;
        int lv = atoi(level);
        if (lv < 1 || lv > 3 || strcmp(type, "Instruction") == 0) continue;
        double b = fastln_parse_bytes(size);
        if (b > 0 && sizes[lv] == 0) sizes[lv] = b;
    }
}

#ifdef POLICY_CPUID
/* sizes[1..3] from the deterministic cache parameters: leaf 4 (Intel), else
 * 0x8000001D (AMD) */
static void from_cpuid(double sizes[4])
{
    unsigned a, b, c, d, leaf = 4;
    if (__get_cpuid_max(0, NULL) < 4) leaf = 0;
    if (leaf) {
        __cpuid_count(4, 0, a, b, c, d);
        if ((a & 0x1f) == 0) leaf = 0;
    }
    if (!leaf && __get_cpuid_max(0x80000000u, NULL) >= 0x8000001Du) leaf = 0x8000001Du;
    if (!leaf) return;
    for (unsigned i = 0; i < 16; i++) {
        __cpuid_count(leaf, i, a, b, c, d);
        unsigned type = a & 0x1f, lv = (a >> 5) & 7;
        if (type == 0) break;
        if (type == 2 || lv < 1 || lv > 3) continue;   /* instruction caches */
        double bytes = (double)((b >> 22) + 1) * (((b >> 12) & 0x3ff) + 1) *
                       ((b & 0xfff) + 1) * ((double)c + 1);
        if (sizes[lv] == 0) sizes[lv] = bytes;
    }
}

/* Whether cpuid reports a hypervisor underneath (leaf 1, ecx bit 31) */
static int under_hypervisor(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return (int)((c >> 31) & 1);
}
#else
static int under_hypervisor(void) { return 0; }
#endif

int fastln_caches_detect(fastln_caches *out, int use_sysconf, const char *sysfs_root,
                         int use_cpuid)
{
    double sizes[4] = {0, 0, 0, 0};
    for (int lv = 1; lv <= 3; lv++)
        if (use_sysconf) sizes[lv] = from_sysconf(lv);
    if (sysfs_root) from_sysfs(sizes, sysfs_root);
#ifdef POLICY_CPUID
    if (use_cpuid) from_cpuid(sizes);
#else
    (void)use_cpuid;
#endif
    const double fallback[4] = {0, FASTLN_FALLBACK_L1, FASTLN_FALLBACK_L2, FASTLN_FALLBACK_L3};
    int fell = 0;
    for (int lv = 1; lv <= 3; lv++)
        if (sizes[lv] <= 0) {
            sizes[lv] = fallback[lv];
            fell |= 1 << (lv - 1);
        }
    out->l1 = sizes[1];
    out->l2 = sizes[2];
    out->l3 = sizes[3];
    out->l3_shared = use_cpuid ? under_hypervisor() : 0;
    return fell;
}

static fastln_caches g_caches;
static int g_caches_ready = 0;

/* The machine's sizes, then the environment's valid overrides; an L3 given
 * by FASTLN_L3_BYTES is the one calls count on, shared or not */
static void detect_with_env(fastln_caches *c)
{
    fastln_caches_detect(c, 1, "/sys/devices/system/cpu/cpu0/cache", 1);
    double v = fastln_parse_bytes(getenv("FASTLN_L1_BYTES"));   /* 0 or invalid: ignored */
    if (v > 0) c->l1 = v;
    v = fastln_parse_bytes(getenv("FASTLN_L2_BYTES"));
    if (v > 0) c->l2 = v;
    v = fastln_parse_bytes(getenv("FASTLN_L3_BYTES"));
    if (v > 0) {
        c->l3 = v;
        c->l3_shared = 0;
    }
}

const fastln_caches *fastln_caches_get(void)
{
    if (!__atomic_load_n(&g_caches_ready, __ATOMIC_ACQUIRE)) {
        fastln_caches c;   /* idempotent: a race stores the same sizes */
        detect_with_env(&c);
        g_caches = c;
        __atomic_store_n(&g_caches_ready, 1, __ATOMIC_RELEASE);
    }
    return &g_caches;
}

void fastln_caches_set(const fastln_caches *c)
{
    fastln_caches d;
    if (!c) {
        detect_with_env(&d);
        c = &d;
    }
    g_caches = *c;
    __atomic_store_n(&g_caches_ready, 1, __ATOMIC_RELEASE);
}
