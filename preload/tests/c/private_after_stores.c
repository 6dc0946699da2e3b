/* A file mapped writable and shared and stored to, then mapped again
 * writable and MAP_PRIVATE (the kernel's mapping, under the shim too):
 * over the first mapping with MAP_FIXED, or beside it. The private
 * mapping shows what was stored through the shared one, as the kernel's
 * page cache has it. Ten rounds of each.
 *
 * usage: private_after_stores FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define PAGES 8
#define LEN (PAGES * PAGE)
#define ROUNDS 10

int main(int argc, char **argv) {
  usage(argc, 1, "private_after_stores FILE");
  int fd = create_filled(argv[1], '.', LEN);
  for (int fixed = 1; fixed >= 0; fixed--) {
    int failed = 0, stale = 0;
    for (int r = 0; r < ROUNDS; r++) {
      char c = 'A' + r + 10 * fixed;
      char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
      for (int i = 0; i < PAGES; i++)
        p[i * PAGE + r] = c;
      char *q = mmap(fixed ? p : NULL, LEN, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | (fixed ? MAP_FIXED : 0), fd, 0);
      if (q == MAP_FAILED || (fixed && q != p)) {
        failed++;
      } else {
        for (int i = 0; i < PAGES; i++)
          stale += q[i * PAGE + r] != c;
        munmap(q, LEN);
      }
      if (!fixed || q != p)
        munmap(p, LEN);
    }
    printf("%s: %d rounds, %d failed, %d stale pages\n",
           fixed ? "MAP_FIXED over it" : "beside it", ROUNDS, failed, stale);
  }
  return 0;
}
