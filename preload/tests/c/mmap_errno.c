/* A successful mmap leaves errno as the program had it, with or without
 * the shim: a file mapped with MAP_FIXED over the program's own memory
 * (the engine refuses the range, the kernel maps it), and a file mapped
 * PROT_EXEC while its writable shared mapping holds stores (written back
 * first, then the kernel's mapping). And a successful msync, mprotect,
 * mremap or munmap of the pager's mapping holding stores leaves it too
 * (the engine's write-back and ioctls on the way set it).
 *
 * usage: mmap_errno FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "mmap_errno FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *own = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "mmap");
  errno = 1234;
  char *p = mmap(own, LEN, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  printf("MAP_FIXED over own memory: %s, errno %d\n", p == own ? "mapped" : "failed", errno);
  munmap(p, LEN);
  p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  p[0] = 's';
  errno = 1234;
  char *x = mmap(NULL, LEN, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  printf("PROT_EXEC beside stores: %s, errno %d\n", x == MAP_FAILED ? "failed" : "mapped",
         errno);
  p[PAGE] = 't';
  errno = 1234;
  int r = msync(p, LEN, MS_SYNC);
  printf("msync: %d, errno %d\n", r, errno);
  p[2 * PAGE] = 'u';
  errno = 1234;
  r = mprotect(p, LEN, PROT_READ);
  printf("mprotect: %d, errno %d\n", r, errno);
  errno = 1234;
  char *q = mremap(p, LEN, LEN / 2, 0);
  printf("mremap: %s, errno %d\n", q == p ? "shrunk" : "failed", errno);
  errno = 1234;
  r = munmap(p, LEN / 2);
  printf("munmap: %d, errno %d\n", r, errno);
  return 0;
}
