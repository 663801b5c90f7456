/*
 * The CPU's optional features that the kernels ask for at run time (isa.h):
 * each decided once, and FASTLN_NO_AMX, FASTLN_NO_VNNI turn AMX and
 * AVX512-VNNI off.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE   /* syscall (the AMX permission), under -std=c99 */
#endif
#include "isa/isa.h"

/* Whether the environment variable name (NULL: none) turns a feature off:
 * set, and neither empty nor "0". */
static inline int env_off(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v && strcmp(v, "0") != 0;
}

/* AMX with bfloat16 (Intel's tile unit): the CPU has AMX-TILE and
 * AMX-BF16 (CPUID leaf 7), the OS saves tile state (XCR0 bits 17, 18), and
 * Linux grants this process the tile data (arch_prctl). FASTLN_NO_AMX=1
 * turns it off (the other bfloat16 path then runs). Decided once. */
#if defined(FASTLN_X86) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
static int amx_usable(void)
{
    if (env_off("FASTLN_NO_AMX")) return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return 0;   /* AMX-TILE, AMX-BF16 */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;   /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#else
static int amx_usable(void) { return 0; }
#endif

int fastln_cpu_has_amx_bf16(void)
{
    static int has = -1;
    int h = __atomic_load_n(&has, __ATOMIC_ACQUIRE);
    if (h < 0) {
        h = amx_usable();
        __atomic_store_n(&has, h, __ATOMIC_RELEASE);
    }
    return h;
}

/* Whether the CPU has an instruction-set feature (a literal of
 * __builtin_cpu_supports) and env_off(off) is not set: decided once and kept
 * in a static. */
#if defined(FASTLN_X86) && (defined(__GNUC__) || defined(__clang__))
#define CPU_FEATURE(feature, off)                                                  \
    do {                                                                           \
        static int has = -1;                                                       \
        int h = __atomic_load_n(&has, __ATOMIC_RELAXED);                           \
        if (h < 0) {                                                               \
            __builtin_cpu_init();                                                  \
            h = __builtin_cpu_supports(feature) && !env_off(off);                  \
            __atomic_store_n(&has, h, __ATOMIC_RELAXED);                           \
        }                                                                          \
        return h;                                                                  \
    } while (0)
#else
#define CPU_FEATURE(feature, off) return 0
#endif

/* AVX512-VNNI, for the int8 products; FASTLN_NO_VNNI=1 turns it off (the
 * VPMADDWD kernel then runs, with the same results). */
int fastln_cpu_has_avx512vnni(void) { CPU_FEATURE("avx512vnni", "FASTLN_NO_VNNI"); }

int fastln_cpu_has_avx512bf16(void) { CPU_FEATURE("avx512bf16", NULL); }
