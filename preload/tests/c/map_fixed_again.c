/* A file mapped writable and shared, stored to, then mapped again with
 * MAP_FIXED over the first mapping (as a program that refreshes its
 * mapping in place does): the new mapping shows what was stored through
 * the old one. Twenty rounds, each a new mapping storing its own bytes.
 *
 * usage: map_fixed_again FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 8
#define ROUNDS 20

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: map_fixed_again FILE\n");
    return 2;
  }
  static char buf[PAGES * PAGE];
  memset(buf, '.', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  int failed = 0, stale = 0;
  for (int r = 0; r < ROUNDS; r++) {
    char *p = mmap(NULL, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    for (int i = 0; i < PAGES; i++)
      p[i * PAGE + r] = 'A' + i;
    char *q = mmap(p, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (q != p) {
      if (!failed++)
        printf("mmap MAP_FIXED: %s\n", q == MAP_FAILED ? strerror(errno) : "moved");
      q = p;
    } else {
      for (int i = 0; i < PAGES; i++)
        stale += p[i * PAGE + r] != 'A' + i;
    }
    if (munmap(q, sizeof buf) != 0) {
      perror("munmap");
      return 1;
    }
  }
  printf("%d rounds, %d failed, %d stale pages\n", ROUNDS, failed, stale);
  return 0;
}
