/* mremap(MREMAP_MAYMOVE | MREMAP_FIXED) of a file mapping to a target
 * over the mapping itself: the kernel's EINVAL, whether the target is the
 * mapping's own address (a shrink) or overlaps it (a move by two pages).
 *
 * usage: mremap_onto_itself FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "mremap_onto_itself FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  char *q = mremap(p, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, p + 2 * PAGE);
  printf("two pages on: %s\n", q == MAP_FAILED ? strerror(errno) : "moved");
  q = mremap(p, LEN, 2 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, p);
  printf("its own address: %s\n", q == MAP_FAILED ? strerror(errno) : "moved");
  printf("still reads %c\n", p[3 * PAGE]);
  return 0;
}
