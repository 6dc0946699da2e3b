/* A file stored to through its writable shared mapping, then mapped again
 * with a protection the shim leaves to the kernel (PROT_EXEC, private or
 * shared): each new mapping shows the stores, as without the shim.
 *
 * usage: exec_after_stores FILE */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: exec_after_stores FILE\n");
    return 2;
  }
  static char a[LEN];
  memset(a, 'a', sizeof a);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memcpy(p + 10, "stored", 6);
  char *x = mmap(NULL, LEN, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  if (x == MAP_FAILED) {
    perror("mmap PROT_EXEC private");
    return 1;
  }
  printf("PROT_EXEC private: %.6s\n", x + 10);
  memcpy(p + PAGE + 10, "again!", 6);
  char *w = mmap(NULL, LEN, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
  if (w == MAP_FAILED) {
    perror("mmap PROT_EXEC shared");
    return 1;
  }
  printf("PROT_EXEC shared: %.6s\n", w + PAGE + 10);
  munmap(x, LEN);
  munmap(w, LEN);
  munmap(p, LEN);
  return 0;
}
