/* Writable shared mappings of one file beside each other, made by calls
 * the shim leaves to the kernel (PROT_EXEC, PROT_WRITE without PROT_READ,
 * a mapping past the end of the file, MAP_FIXED over another mapping) and
 * by calls it serves, in both orders; then mprotect(PROT_WRITE) of a
 * read-only shared mapping of the file beside a writable one. Each line
 * says what the call answered; the last says what the file holds where
 * both mappings stored (under the kernel, the later store).
 *
 * usage: writable_beside FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>

#include "util.h"

#define LEN (4 * PAGE)
#define RW (PROT_READ | PROT_WRITE)

static char *try_map(const char *what, size_t len, int prot, int flags, int fd) {
  char *p = mmap(NULL, len, prot, flags, fd, 0);
  printf("%s: %s\n", what, p == MAP_FAILED ? strerror(errno) : "mapped");
  return p;
}

static void try_mprotect(const char *what, char *p, int prot) {
  int rc = mprotect(p, LEN, prot);
  printf("%s: %s\n", what, rc != 0 ? strerror(errno) : "done");
}

static void unmap(char *p, size_t len) {
  if (p != MAP_FAILED)
    munmap(p, len);
}

int main(int argc, char **argv) {
  usage(argc, 1, "writable_beside FILE");
  int fd = create_filled(argv[1], 'a', LEN);

  /* The served mapping first, stored to. */
  char *p = map_or_exit(LEN, RW, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + 10, "stored", 6);
  char *w = try_map("rwx beside", LEN, RW | PROT_EXEC, MAP_SHARED, fd);
  p[PAGE + 100] = 'Q'; /* the served mapping's page is dirty again */
  if (w != MAP_FAILED)
    memcpy(w + PAGE + 10, "viaexe", 6);
  unmap(w, LEN);
  w = try_map("write-only beside", LEN, PROT_WRITE, MAP_SHARED, fd);
  unmap(w, LEN);
  w = try_map("past the end beside", 2 * LEN, RW, MAP_SHARED, fd);
  unmap(w, 2 * LEN);
  char *r = try_map("read-only exec beside", LEN, PROT_READ | PROT_EXEC, MAP_SHARED, fd);
  if (r != MAP_FAILED)
    try_mprotect("its mprotect rwx", r, RW | PROT_EXEC);
  unmap(r, LEN);
  /* Over half of the served mapping: the other half stays. */
  char *o = mmap(p, 2 * PAGE, RW, MAP_SHARED | MAP_FIXED, fd, 0);
  printf("MAP_FIXED over half of it: %s\n", o == MAP_FAILED ? strerror(errno) : "mapped");
  munmap(p, LEN);
  char got[7] = {0};
  if (syscall(SYS_pread64, fd, got, 6, PAGE + 10) != 6) {
    perror("pread");
    return 1;
  }
  printf("file where both stored: %s\n", got);

  /* The kernel's writable mapping first. */
  char *k = map_or_exit(LEN, RW | PROT_EXEC, MAP_SHARED, fd, 0, "mmap rwx");
  memcpy(k + 10, "kernel", 6);
  char *s = try_map("served rw after it", LEN, RW, MAP_SHARED, fd);
  unmap(s, LEN);
  s = try_map("served read-only after it", LEN, PROT_READ, MAP_SHARED, fd);
  if (s != MAP_FAILED)
    printf("it reads %.6s\n", s + 10);
  unmap(s, LEN);
  munmap(k, LEN);
  s = try_map("served rw once it is gone", LEN, RW, MAP_SHARED, fd);
  if (s != MAP_FAILED)
    printf("it reads %.6s\n", s + 10);
  unmap(s, LEN);

  /* A served read-only mapping beside a writable one of the kernel's:
   * one the shim sees, and one made writable by a raw system call. */
  r = try_map("served read-only", LEN, PROT_READ, MAP_SHARED, fd);
  k = try_map("rwx beside it", LEN, RW | PROT_EXEC, MAP_SHARED, fd);
  unmap(k, LEN);
  k = map_or_exit(LEN, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0, "mmap r-x");
  try_mprotect("its mprotect rwx", k, RW | PROT_EXEC);
  int rc = syscall(SYS_mprotect, k, LEN, RW | PROT_EXEC);
  printf("its raw mprotect rwx: %s\n", rc != 0 ? strerror(errno) : "done");
  if (r != MAP_FAILED)
    try_mprotect("the served one's mprotect rw", r, RW);
  munmap(k, LEN);
  unmap(r, LEN);
  return 0;
}
