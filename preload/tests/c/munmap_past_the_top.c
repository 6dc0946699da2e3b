/* munmap of a range that runs past the top of the address space is
 * EINVAL, and unmaps nothing: not the file's mapping at its start, nor
 * the program's memory above it.
 *
 * usage: munmap_past_the_top FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 1, "munmap_past_the_top FILE");
  int fd = create_filled(argv[1], 'a', 4 * PAGE);
  char *p = map_or_exit(4 * PAGE, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  /* Memory of the program's own above the mapping (the heap or a stack
   * would do as well): one page, written. */
  char *q = map_or_exit(PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "anon");
  q[0] = 'q';
  char *lo = p < q ? p : q;
  int rc = munmap(lo, (size_t)1 << 62);
  int e = errno;
  printf("munmap: %d (%s), mapping reads '%c', memory reads '%c'\n", rc,
         e == EINVAL ? "EINVAL" : "other", p[PAGE], q[0]);
  return 0;
}
