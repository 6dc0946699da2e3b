/* MADV_WILLNEED is a hint. The kernel reads ahead a bounded part of the
 * range (at most its readahead window or the device's best I/O size) and
 * answers 0 even where it reads nothing (past the end of the file).
 *
 * Here: a file of 4,096 pages mapped shared and read-only, advised
 * WILLNEED over all of it, then truncated to 2 pages and advised again
 * over the part past its end. The shim read the whole range in, past its
 * budget, synchronously; and over the part past the end it answered EIO.
 *
 * usage: willneed_large FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define PAGES 4096
#define LEN ((size_t)PAGES * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "willneed_large FILE");
  int fd = create_filled(argv[1], 'l', LEN);
  char *p = map_or_exit(LEN, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  errno = 0;
  int r = madvise(p, LEN, MADV_WILLNEED);
  printf("whole: madvise %d %s; first %c\n", r, r == 0 ? "" : strerror(errno), p[0]);
  if (ftruncate(fd, 2 * PAGE) != 0)
    return 1;
  errno = 0;
  r = madvise(p + 2 * PAGE, LEN - 2 * PAGE, MADV_WILLNEED);
  printf("past the end: madvise %d %s; first %c\n", r, r == 0 ? "" : strerror(errno), p[0]);
  return 0;
}
