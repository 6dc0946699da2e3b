/* A file mapped writable and shared and stored to, then mapped again
 * writable and MAP_PRIVATE (the kernel's mapping, under the shim too):
 * over the first mapping with MAP_FIXED, or beside it. The private
 * mapping shows what was stored through the shared one, as the kernel's
 * page cache has it. Ten rounds of each.
 *
 * usage: private_after_stores FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 8
#define ROUNDS 10

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: private_after_stores FILE\n");
    return 2;
  }
  static char buf[PAGES * PAGE];
  memset(buf, '.', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  for (int fixed = 1; fixed >= 0; fixed--) {
    int failed = 0, stale = 0;
    for (int r = 0; r < ROUNDS; r++) {
      char c = 'A' + r + 10 * fixed;
      char *p = mmap(NULL, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
      }
      for (int i = 0; i < PAGES; i++)
        p[i * PAGE + r] = c;
      char *q = mmap(fixed ? p : NULL, sizeof buf, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | (fixed ? MAP_FIXED : 0), fd, 0);
      if (q == MAP_FAILED || (fixed && q != p)) {
        failed++;
      } else {
        for (int i = 0; i < PAGES; i++)
          stale += q[i * PAGE + r] != c;
        munmap(q, sizeof buf);
      }
      if (!fixed || q != p)
        munmap(p, sizeof buf);
    }
    printf("%s: %d rounds, %d failed, %d stale pages\n",
           fixed ? "MAP_FIXED over it" : "beside it", ROUNDS, failed, stale);
  }
  return 0;
}
