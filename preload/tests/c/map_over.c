/* Maps over, moves and cuts mappings of a file and of anonymous memory
 * with calls a program may make, and prints what the kernel reports
 * after each, so that a run under the shim can be compared with a plain
 * one line by line.
 *
 * usage: map_over FILE   (FILE: at least 1 MiB) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (1 << 20)
#define ANON (32 << 20)
#define PG 4096

/* The permissions /proc/self/maps gives the mapping that starts at p. */
static const char *perms(void *p) {
    static char out[8];
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    strcpy(out, "none");
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char pr[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, pr) == 3 && a == (unsigned long)p)
            strcpy(out, pr);
    }
    if (f)
        fclose(f);
    return out;
}

/* Whether anything is mapped at p (a no-replace mapping there fails). */
static const char *mapped(void *p) {
    void *q = mmap(p, PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (q == MAP_FAILED)
        return errno == EEXIST ? "mapped" : "error";
    munmap(q, PG);
    return q == p ? "free" : "elsewhere";
}

static const char *err(int rc) {
    static char out[32];
    if (rc == 0)
        return "0";
    snprintf(out, sizeof out, "-1 %s", strerrorname_np(errno));
    return out;
}

static char *map_file(int fd) {
    char *m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        printf("map file: %s\n", strerrorname_np(errno));
        exit(1);
    }
    return m;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror("open");
        return 1;
    }

    /* 1. A writable shared file mapping, written, then replaced whole by
     * an anonymous MAP_FIXED mapping: the write reaches the file, and the
     * new mapping is the program's to protect and unmap. */
    char *m = map_file(fd);
    m[5] = 42;
    char *o = mmap(m, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    printf("over: %s\n", o == m ? "same address" : "moved");
    memset(o, 9, LEN);
    unsigned char b = 0;
    pread(fd, &b, 1, 5);
    printf("file byte after map over: %d\n", b);
    int rc = mprotect(o, LEN, PROT_READ);
    printf("mprotect: %s", err(rc));
    printf(" perms %s\n", perms(o));
    rc = munmap(o, LEN);
    printf("munmap: %s", err(rc));
    printf(" now %s\n", mapped(o));

    /* 2. The file mapped again reads the write. */
    m = map_file(fd);
    printf("again: byte %d\n", m[5]);


    /* 3. mremap to a fixed address without MREMAP_MAYMOVE is EINVAL. */
    char *to = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *r = mremap(m, LEN, LEN, MREMAP_FIXED, to);
    printf("mremap fixed without maymove: %s\n", r == MAP_FAILED ? strerrorname_np(errno) : "moved");
    munmap(to, LEN);

    /* 4. MAP_FIXED over the middle of the file mapping: the pages on
     * either side still read the file; unmapping the whole range then
     * unmaps the program's mapping in the middle too. */
    char *mid = mmap(m + 4 * PG, 4 * PG, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    mid[0] = 1;
    printf("middle: %s sides %d %d\n", mid == m + 4 * PG ? "placed" : "moved", m[5],
           (unsigned char)m[8 * PG]);
    rc = munmap(m, LEN);
    printf("munmap all: %s", err(rc));
    printf(" middle %s", mapped(mid));
    printf(" start %s\n", mapped(m));

    /* 5. MADV_DONTNEED over a hole the program's munmap left in an
     * anonymous mapping: ENOMEM, and the pages on both sides are dropped. */
    char *a = mmap(NULL, ANON, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 4; i++)
        a[i * PG] = 1;
    munmap(a + 2 * PG, PG);
    rc = madvise(a, 4 * PG, MADV_DONTNEED);
    printf("dontneed over a hole: %s pages %d %d %d\n", err(rc), a[0], a[PG], a[3 * PG]);
    munmap(a, ANON);

    /* 6. The file mapped writable and shared again while the program's
     * mapping still lies over the first one. */
    m = map_file(fd);
    o = mmap(m, LEN, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    char *m2 = map_file(fd);
    printf("again while mapped over: byte %d\n", m2[5]);
    munmap(o, LEN);
    munmap(m2, LEN);
    return 0;
}
