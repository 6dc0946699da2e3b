/* What the test programs share: creating the file they work on, the
 * usage check, and a mapping that must succeed. Included with quotes, so
 * found beside the program (the driver compiles each with `cc FILE.c`).
 * A program defines _GNU_SOURCE before it includes this. */
#ifndef UFFD_PAGER_TEST_UTIL_H
#define UFFD_PAGER_TEST_UTIL_H

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096

/* Exits 2 with `usage: TEXT` unless the program got `args` arguments. */
static inline void usage(int argc, int args, const char *text) {
  if (argc != args + 1) {
    fprintf(stderr, "usage: %s\n", text);
    exit(2);
  }
}

/* `path` created (truncated) with `flags` added to O_RDWR, holding the
 * `len` bytes at `buf`; its descriptor. Exits 1 on failure. */
static inline int create_with(const char *path, int flags, const void *buf, size_t len) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | flags, 0644);
  if (fd < 0 || write(fd, buf, len) != (ssize_t)len) {
    perror("create");
    exit(1);
  }
  return fd;
}

/* `path` created holding `len` bytes `byte`; its descriptor. */
static inline int create_filled(const char *path, char byte, size_t len) {
  char *buf = malloc(len);
  if (buf == NULL) {
    perror("malloc");
    exit(1);
  }
  memset(buf, byte, len);
  int fd = create_with(path, 0, buf, len);
  free(buf);
  return fd;
}

/* mmap(NULL, len, prot, flags, fd, off), which must succeed: exits 1
 * with `what` on failure. */
static inline char *map_or_exit(size_t len, int prot, int flags, int fd, off_t off,
                                const char *what) {
  char *p = mmap(NULL, len, prot, flags, fd, off);
  if (p == MAP_FAILED) {
    perror(what);
    exit(1);
  }
  return p;
}

/* A writable shared mapping of the first `len` bytes of `fd` (two pages
 * at least), with "stored" stored at 10 and "again!" at PAGE + 10. */
static inline char *map_and_store(int fd, size_t len) {
  char *p = map_or_exit(len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + 10, "stored", 6);
  memcpy(p + PAGE + 10, "again!", 6);
  return p;
}

/* O_APPEND set on `fd` (fcntl); exits 1 on failure. */
static inline void set_o_append(int fd) {
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_APPEND) != 0) {
    perror("fcntl");
    exit(1);
  }
}

/* msync(p, len, MS_SYNC); exits 1 on failure. */
static inline void msync_or_exit(char *p, size_t len) {
  if (msync(p, len, MS_SYNC) != 0) {
    perror("msync");
    exit(1);
  }
}

/* Where a store that faults returns to (see `try_store`). */
static sigjmp_buf store_refused;

static inline void store_segv(int sig) {
  (void)sig;
  siglongjmp(store_refused, 1);
}

/* Stores `c` at `at`; whether the store went through (0: SIGSEGV). */
static inline int try_store(char *at, char c) {
  signal(SIGSEGV, store_segv);
  if (sigsetjmp(store_refused, 1) == 0) {
    *(volatile char *)at = c;
    return 1;
  }
  return 0;
}

#endif
