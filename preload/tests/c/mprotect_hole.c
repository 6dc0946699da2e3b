/* mprotect(PROT_WRITE) over a read-only MAP_SHARED file mapping and a
 * hole after it is ENOMEM, but the kernel has made the mapping before the
 * hole writable by then: a store through it reaches the file at fsync(2).
 * The file is read back with a raw system call, which no interposer sees.
 *
 * usage: mprotect_hole FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>

#include "util.h"

#define N 8

int main(int argc, char **argv) {
  usage(argc, 1, "mprotect_hole FILE");
  int fd = create_filled(argv[1], 'a', N * PAGE);
  char *p = map_or_exit(N * PAGE, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  if (munmap(p + (N - 2) * PAGE, 2 * PAGE) != 0) {
    perror("munmap");
    return 1;
  }
  int rc = mprotect(p, N * PAGE, PROT_READ | PROT_WRITE);
  int e = errno;
  p[0] = 's';
  if (fsync(fd) != 0) {
    perror("fsync");
    return 1;
  }
  char c = 0;
  if (syscall(SYS_pread64, fd, &c, 1, 0) != 1)
    return 1;
  printf("mprotect: %d (%s), the file reads '%c'\n", rc, e == ENOMEM ? "ENOMEM" : "other", c);
  return 0;
}
