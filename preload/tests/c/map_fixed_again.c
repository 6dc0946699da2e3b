/* A file mapped writable and shared, stored to, then mapped again with
 * MAP_FIXED over the first mapping (as a program that refreshes its
 * mapping in place does): the new mapping shows what was stored through
 * the old one. Twenty rounds, each a new mapping storing its own bytes.
 *
 * usage: map_fixed_again FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define PAGES 8
#define LEN (PAGES * PAGE)
#define ROUNDS 20

int main(int argc, char **argv) {
  usage(argc, 1, "map_fixed_again FILE");
  int fd = create_filled(argv[1], '.', LEN);
  int failed = 0, stale = 0;
  for (int r = 0; r < ROUNDS; r++) {
    char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
    for (int i = 0; i < PAGES; i++)
      p[i * PAGE + r] = 'A' + i;
    char *q = mmap(p, LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (q != p) {
      if (!failed++)
        printf("mmap MAP_FIXED: %s\n", q == MAP_FAILED ? strerror(errno) : "moved");
      q = p;
    } else {
      for (int i = 0; i < PAGES; i++)
        stale += p[i * PAGE + r] != 'A' + i;
    }
    if (munmap(q, LEN) != 0) {
      perror("munmap");
      return 1;
    }
  }
  printf("%d rounds, %d failed, %d stale pages\n", ROUNDS, failed, stale);
  return 0;
}
