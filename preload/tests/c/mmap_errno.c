/* A successful mmap leaves errno as the program had it, with or without
 * the shim: a file mapped with MAP_FIXED over the program's own memory
 * (the engine refuses the range, the kernel maps it), and a file mapped
 * PROT_EXEC while its writable shared mapping holds stores (written back
 * first, then the kernel's mapping).
 *
 * usage: mmap_errno FILE */
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
    fprintf(stderr, "usage: mmap_errno FILE\n");
    return 2;
  }
  static char a[LEN];
  memset(a, 'a', sizeof a);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a) {
    perror("create");
    return 1;
  }
  char *own = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (own == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  errno = 1234;
  char *p = mmap(own, LEN, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  printf("MAP_FIXED over own memory: %s, errno %d\n", p == own ? "mapped" : "failed", errno);
  munmap(p, LEN);
  p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  p[0] = 's';
  errno = 1234;
  char *x = mmap(NULL, LEN, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  printf("PROT_EXEC beside stores: %s, errno %d\n", x == MAP_FAILED ? "failed" : "mapped",
         errno);
  return 0;
}
