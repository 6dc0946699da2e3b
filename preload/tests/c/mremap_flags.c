/* mremap of a whole file mapping with a flag mremap does not know (8, 16,
 * 1 << 30) beside MREMAP_MAYMOVE: the kernel answers EINVAL and leaves the
 * mapping where it was.
 *
 * usage: mremap_flags FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "mremap_flags FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  int unknown[] = {8, 16, 1 << 30};
  for (int i = 0; i < 3; i++) {
    char *q = mremap(p, LEN, LEN / 2, MREMAP_MAYMOVE | unknown[i]);
    printf("flag %#x: %s\n", unknown[i], q == MAP_FAILED ? strerror(errno) : "remapped");
    if (q != MAP_FAILED)
      p = q;
  }
  printf("it reads %c %c\n", p[0], p[3 * PAGE]);
  return 0;
}
