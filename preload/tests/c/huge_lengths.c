/* Calls on a file mapping with lengths that round past the address space
 * (SIZE_MAX), each printed with its result and errno, and the errno a
 * successful mmap leaves; the mapping is read after them. Under the shim
 * the output must be the kernel's own.
 *
 * usage: huge_lengths FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>

#include "util.h"

#define LEN (4 * 4096)

static void say(const char *call, long rc) {
  printf("%s %ld %d\n", call, rc < 0 ? -1L : 0L, rc < 0 ? errno : 0);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  int fd = create_filled(argv[1], 'h', LEN);
  errno = 1234;
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  printf("mmap errno after success %d\n", errno);
  errno = 0;
  void *q = mmap(NULL, SIZE_MAX, PROT_READ, MAP_SHARED, fd, 0);
  say("mmap SIZE_MAX", q == MAP_FAILED ? -1 : 0);
  errno = 0;
  void *r = mremap(p, LEN, SIZE_MAX, MREMAP_MAYMOVE);
  say("mremap to SIZE_MAX", r == MAP_FAILED ? -1 : 0);
  errno = 0;
  r = mremap(p, SIZE_MAX, LEN, MREMAP_MAYMOVE);
  say("mremap from SIZE_MAX", r == MAP_FAILED ? -1 : 0);
  errno = 0;
  say("mprotect", mprotect(p, SIZE_MAX, PROT_READ));
  errno = 0;
  say("madvise", madvise(p, SIZE_MAX, MADV_RANDOM));
  errno = 0;
  say("munmap", munmap(p, SIZE_MAX));
  for (int i = 0; i < LEN; i += 4096)
    if (p[i] != 'h') return 1;
  say("munmap whole", munmap(p, LEN));
  printf("done\n");
  return 0;
}
