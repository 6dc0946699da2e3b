/* mremap(MREMAP_MAYMOVE | MREMAP_FIXED) of a file mapping to a target
 * over the mapping itself: the kernel's EINVAL, whether the target is the
 * mapping's own address (a shrink) or overlaps it (a move by two pages).
 *
 * usage: mremap_onto_itself FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: mremap_onto_itself FILE\n");
    return 2;
  }
  static char a[LEN];
  memset(a, 'a', sizeof a);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, LEN, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  char *q = mremap(p, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, p + 2 * PAGE);
  printf("two pages on: %s\n", q == MAP_FAILED ? strerror(errno) : "moved");
  q = mremap(p, LEN, 2 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, p);
  printf("its own address: %s\n", q == MAP_FAILED ? strerror(errno) : "moved");
  printf("still reads %c\n", p[3 * PAGE]);
  return 0;
}
