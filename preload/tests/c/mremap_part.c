/* mremap of part of a private anonymous mapping (its first four pages,
 * grown to six and moved): the kernel moves them; the shim refuses
 * (EINVAL) where the mapping is the pager's, and the mapping is as it was.
 * Either way every page reads what was written, and nothing faults.
 *
 * usage: mremap_part */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN ((size_t)16 << 20)

int main(int argc, char **argv) {
  usage(argc, 0, "mremap_part");
  (void)argv;
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "mmap");
  for (int i = 0; i < 8; i++)
    p[i * PAGE] = (char)('a' + i);
  char *q = mremap(p, 4 * PAGE, 6 * PAGE, MREMAP_MAYMOVE);
  if (q == MAP_FAILED) {
    int e = errno;
    printf("mremap of part: %s, the mapping reads %c%c\n", e == EINVAL ? "EINVAL" : "other",
           p[0], p[7 * PAGE]);
    return 0;
  }
  printf("mremap of part: moved, reads %c%c%d, the rest reads %c%c\n", q[0], q[3 * PAGE],
         q[5 * PAGE], p[4 * PAGE], p[7 * PAGE]);
  return 0;
}
