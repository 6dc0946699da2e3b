/* Calls the kernel refuses or treats specially, each of which the shim
 * answered otherwise (found by review):
 * - MAP_SHARED_VALIDATE | MAP_SYNC on a file that is not DAX: the kernel's
 *   EOPNOTSUPP, which libpmem reads as "not persistent memory, msync";
 *   the shim mapped it;
 * - a map type that is neither shared nor private: EINVAL;
 * - MAP_32BIT: an address below 4 GiB; the shim placed it anywhere;
 * - an offset and length whose sum overflows: the kernel's error; the
 *   debug shim panicked (an abort);
 * - madvise(MADV_DONTNEED) with a length that wraps past the top of the
 *   address space: EINVAL, nothing dropped; the shim zeroed the pager's
 *   mappings above the address first;
 * - mprotect(PROT_WRITE) of length 0 changes nothing; the shim marked the
 *   mapping writable, so a second mapping of its file was refused.
 * Prints one line per call; the driver compares the output with the
 * program's own without the shim.
 *
 * usage: mapping_flags FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>

#include "util.h"

#define N 8
#define ANON (4 << 20)

static void said(const char *what, void *p) {
  if (p == MAP_FAILED)
    printf("%s: failed (%s)\n", what, strerrorname_np(errno));
  else
    printf("%s: mapped\n", what);
}

int main(int argc, char **argv) {
  usage(argc, 1, "mapping_flags FILE");
  int fd = create_filled(argv[1], 'a', N * PAGE);

  void *s = mmap(NULL, N * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
  said("MAP_SYNC", s);
  if (s != MAP_FAILED)
    munmap(s, N * PAGE);

  void *t = mmap(NULL, N * PAGE, PROT_READ, 0, fd, 0);
  said("map type 0", t);
  if (t != MAP_FAILED)
    munmap(t, N * PAGE);

  char *low = mmap(NULL, ANON, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
  if (low == MAP_FAILED) {
    perror("mmap MAP_32BIT");
    return 1;
  }
  low[0] = 1;
  printf("MAP_32BIT: below 4 GiB: %s\n", (uintptr_t)low + ANON <= (1ULL << 32) ? "yes" : "no");

  void *o = mmap(NULL, 0x8000000000002000ULL, PROT_READ, MAP_SHARED, fd, 0x7ffffffffffff000LL);
  said("offset and length overflow", o);

  char *p = map_or_exit(ANON, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "mmap anon");
  memset(p, 'x', ANON);
  int rc = madvise(p, SIZE_MAX & ~(size_t)(PAGE - 1), MADV_DONTNEED);
  printf("madvise past the top: %d (%s), the memory reads '%c'\n", rc,
         rc ? strerrorname_np(errno) : "-", p[0]);
  rc = madvise(p + 1, PAGE, MADV_DONTNEED);
  printf("madvise unaligned: %d (%s), the memory reads '%c'\n", rc,
         rc ? strerrorname_np(errno) : "-", p[0]);

  char *r = map_or_exit(N * PAGE, PROT_READ, MAP_SHARED, fd, 0, "mmap read-only");
  rc = mprotect(r, 0, PROT_READ | PROT_WRITE);
  printf("mprotect of length 0: %d\n", rc);
  rc = mprotect(r, SIZE_MAX & ~(size_t)(PAGE - 1), PROT_READ | PROT_WRITE);
  printf("mprotect past the top: %d (%s)\n", rc, rc ? strerrorname_np(errno) : "-");
  void *again = mmap(NULL, N * PAGE, PROT_READ, MAP_SHARED, fd, 0);
  said("a second read-only mapping", again);
  printf("the first reads '%c'\n", r[0]);
  return 0;
}
