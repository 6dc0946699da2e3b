/* A memfd sealed against writes (F_SEAL_WRITE): the kernel refuses a
 * writable shared mapping of it (EPERM), maps it read-only, and refuses
 * to make that mapping writable (EACCES). The shim pages it when the
 * patterns take memfds ('/memfd:*').
 *
 * usage: sealed_memfd */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

int main(void) {
  static char a[LEN];
  memset(a, 'a', sizeof a);
  int fd = memfd_create("sealed", MFD_ALLOW_SEALING);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0) {
    perror("memfd");
    return 1;
  }
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  printf("writable shared: %s\n", p == MAP_FAILED ? strerror(errno) : "mapped");
  if (p != MAP_FAILED)
    munmap(p, LEN);
  char *r = map_or_exit(LEN, PROT_READ, MAP_SHARED, fd, 0, "read-only shared");
  printf("read-only shared: reads %c\n", r[0]);
  int rc = mprotect(r, LEN, PROT_READ | PROT_WRITE);
  printf("mprotect(PROT_WRITE): %s\n", rc ? strerror(errno) : "done");
  return 0;
}
