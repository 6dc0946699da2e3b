/* A program that stores to the last page of a writable shared mapping of
 * a file, shrinks the mapping with mremap(2) so that the page is outside
 * it, and writes one byte of that page with pwrite(2). It grows the
 * mapping back (in place or moved) and prints what the page shows, then
 * unmaps it and prints what the file holds there, read with a raw
 * system call (which no interposer sees).
 *
 * usage: mremap_shrink_write FILE */
#define _GNU_SOURCE
#include <sys/syscall.h>

#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 1, "mremap_shrink_write FILE");
  int fd = create_filled(argv[1], '.', 4 * PAGE);
  char *p = map_or_exit(4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + 3 * PAGE, "DD", 2);
  if (mremap(p, 4 * PAGE, 2 * PAGE, 0) != p) {
    perror("mremap (shrink)");
    return 1;
  }
  if (pwrite(fd, "W", 1, 3 * PAGE) != 1) {
    perror("pwrite");
    return 1;
  }
  p = mremap(p, 2 * PAGE, 4 * PAGE, MREMAP_MAYMOVE);
  if (p == MAP_FAILED) {
    perror("mremap (grow)");
    return 1;
  }
  printf("mapping: %.3s\n", p + 3 * PAGE);
  if (munmap(p, 4 * PAGE) != 0) {
    perror("munmap");
    return 1;
  }
  char buf[4] = {0};
  if (syscall(SYS_pread64, fd, buf, 3, 3 * PAGE) != 3) {
    perror("pread");
    return 1;
  }
  printf("file: %.3s\n", buf);
  return 0;
}
