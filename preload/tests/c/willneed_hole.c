/* MADV_WILLNEED over a file mapping with a hole the program's own munmap
 * left: the kernel advises what is mapped and answers ENOMEM for the hole.
 * The shim answered 0 for any range with pager memory in it.
 *
 * usage: willneed_hole FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "willneed_hole FILE");
  int fd = create_filled(argv[1], 'w', LEN);
  char *p = map_or_exit(LEN, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  if (munmap(p + 2 * PAGE, PAGE) != 0)
    return 1;
  errno = 0;
  int r = madvise(p, LEN, MADV_WILLNEED);
  int e = errno;
  printf("madvise %d %s; pages %c %c\n", r, r == 0 ? "" : e == ENOMEM ? "ENOMEM" : "other", p[0],
         p[3 * PAGE]);
  return 0;
}
