/* A read-only shared mapping with a hole the program unmapped, then a
 * pwrite over a range that spans the hole: the pages on both sides show
 * the new bytes. Run with UFFD_PAGER_KIND=anonymous, where the shim drops
 * the written pages of its private copy: a drop over the hole was refused
 * whole, and both sides showed the older bytes.
 *
 * usage: write_over_a_hole FILE */
#define _GNU_SOURCE
#include "util.h"

#define N 4

int main(int argc, char **argv) {
  usage(argc, 1, "write_over_a_hole FILE");
  int fd = create_filled(argv[1], 'a', N * PAGE);
  char *p = map_or_exit(N * PAGE, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  printf("before: %c %c\n", p[0], p[2 * PAGE]);
  if (munmap(p + PAGE, PAGE) != 0) {
    perror("munmap");
    return 1;
  }
  char buf[3 * PAGE];
  memset(buf, 'w', sizeof buf);
  if (pwrite(fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf) {
    perror("pwrite");
    return 1;
  }
  printf("after: %c %c\n", p[0], p[2 * PAGE]);
  return 0;
}
