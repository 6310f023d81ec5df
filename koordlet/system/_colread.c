/*
 * The native column reader of koordlet.system.nativeread: a column of kept-open cgroup files
 * read with pread at offset 0 and parsed in one call, the files' values written to an int64
 * array. Plain C with no Python API: it is loaded with ctypes (one call per column, the GIL
 * released for all of it) and works with any Python version.
 *
 * It accepts only the kernel's exact layout of each file (the whole file, every line, digits
 * only, at most 18 of them a value); anything else stops the column at that file and the
 * Python parsers read the column instead, and they word the errors. So for any file this
 * accepts, the values are the Python parser's (tests/unit/test_nativeread.py checks that
 * against generated and real files).
 */
#define _POSIX_C_SOURCE 200809L /* pread under -std=c11 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define KOORD_BUFFER 16384 /* koordlet.system.cgroupstats.READ_BUFFER */
#define KOORD_MAX_DIGITS 18 /* below 2^63: no overflow to check */

enum {
    KOORD_INTEGER = 0,         /* "<n>\n" (cpuacct.usage): 1 value */
    KOORD_CPU_THROTTLING_V1 = 1, /* v1 cpu.stat: nr_periods, nr_throttled */
    KOORD_MEMORY_LRU_V1 = 2,   /* v1 memory.numa_stat: hierarchical file, anon, unevictable */
};

/* 1 to KOORD_MAX_DIGITS decimal digits at *p into *v, *p moved past them; 0 on success. */
static int digits(const char **p, const char *end, int64_t *v)
{
    const char *s = *p;
    int64_t x = 0;
    int n = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (++n > KOORD_MAX_DIGITS)
            return -1;
        x = x * 10 + (*s - '0');
        s++;
    }
    if (n == 0)
        return -1;
    *p = s;
    *v = x;
    return 0;
}

/* The n bytes of lit at *p, *p moved past them; 0 on success. */
static int literal(const char **p, const char *end, const char *lit, size_t n)
{
    if ((size_t)(end - *p) < n || memcmp(*p, lit, n) != 0)
        return -1;
    *p += n;
    return 0;
}

#define LIT(p, end, s) literal((p), (end), (s), sizeof(s) - 1)

static int parse_integer(const char *p, const char *end, int64_t *out)
{
    if (digits(&p, end, &out[0]) || LIT(&p, end, "\n"))
        return -1;
    return p == end ? 0 : -1;
}

/* nr_periods, nr_throttled, throttled_time; then nr_bursts and burst_time (5.14+) or nothing. */
static int parse_cpu_throttling_v1(const char *p, const char *end, int64_t *out)
{
    int64_t unused;
    if (LIT(&p, end, "nr_periods ") || digits(&p, end, &out[0]) ||
        LIT(&p, end, "\nnr_throttled ") || digits(&p, end, &out[1]) ||
        LIT(&p, end, "\nthrottled_time ") || digits(&p, end, &unused) || LIT(&p, end, "\n"))
        return -1;
    if (p == end)
        return 0;
    if (LIT(&p, end, "nr_bursts ") || digits(&p, end, &unused) ||
        LIT(&p, end, "\nburst_time ") || digits(&p, end, &unused) || LIT(&p, end, "\n"))
        return -1;
    return p == end ? 0 : -1;
}

/* One numa_stat line: "<key>=<pages>" then " N<node>=<pages>" per node, then "\n". */
static int numa_line(const char **p, const char *end, const char *key, int64_t *v)
{
    int64_t unused;
    if (literal(p, end, key, strlen(key)) || digits(p, end, v))
        return -1;
    while (*p < end && **p == ' ') {
        (*p)++;
        if (LIT(p, end, "N") || digits(p, end, &unused) || LIT(p, end, "=") ||
            digits(p, end, &unused))
            return -1;
    }
    return LIT(p, end, "\n");
}

/* The eight lines of a v1 memory.numa_stat in the kernel's order; out: the hierarchical
 * file, anon and unevictable pages. */
static int parse_memory_lru_v1(const char *p, const char *end, int64_t *out)
{
    static const char *const keys[8] = {
        "total=", "file=", "anon=", "unevictable=",
        "hierarchical_total=", "hierarchical_file=", "hierarchical_anon=",
        "hierarchical_unevictable=",
    };
    int64_t v[8];
    for (int i = 0; i < 8; i++)
        if (numa_line(&p, end, keys[i], &v[i]))
            return -1;
    if (p != end)
        return -1;
    out[0] = v[5];
    out[1] = v[6];
    out[2] = v[7];
    return 0;
}

/*
 * Reads fds[0..n) at offset 0 and parses each as `kind`, writing its values (`width` a file: 1,
 * 2 or 3 by kind, in file order) to out, which holds n * width. Returns n when every file was
 * read and parsed; else the index of the first file that was not, with *err = its read's errno,
 * or 0 when it was read but not in the kernel's layout (or filled the buffer). An unknown kind,
 * or a width that is not the kind's (out would be the wrong size), returns 0 with *err = EINVAL
 * before anything is read or written.
 */
int koord_read_column(const int *fds, int n, int kind, int width, int64_t *out, int *err)
{
    char buf[KOORD_BUFFER];
    int expected;
    switch (kind) {
    case KOORD_INTEGER: expected = 1; break;
    case KOORD_CPU_THROTTLING_V1: expected = 2; break;
    case KOORD_MEMORY_LRU_V1: expected = 3; break;
    default: expected = 0; break;
    }
    if (expected == 0 || width != expected) {
        *err = EINVAL;
        return 0;
    }
    *err = 0;
    for (int i = 0; i < n; i++) {
        ssize_t r;
        do
            r = pread(fds[i], buf, sizeof buf, 0);
        while (r < 0 && errno == EINTR);
        if (r < 0) {
            *err = errno;
            return i;
        }
        if (r >= (ssize_t)sizeof buf)
            return i;
        const char *end = buf + r;
        int64_t *values = out + (ptrdiff_t)i * width;
        int bad;
        switch (kind) {
        case KOORD_INTEGER: bad = parse_integer(buf, end, values); break;
        case KOORD_CPU_THROTTLING_V1: bad = parse_cpu_throttling_v1(buf, end, values); break;
        default: bad = parse_memory_lru_v1(buf, end, values); break;
        }
        if (bad)
            return i;
    }
    return n;
}
