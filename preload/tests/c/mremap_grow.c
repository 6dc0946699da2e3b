/* mremap(MREMAP_MAYMOVE) growing a shared file mapping over more of the
 * file: the new pages show the file, and what is stored through the grown
 * mapping reaches it at munmap.
 *
 * usage: mremap_grow FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 8

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: mremap_grow FILE\n");
    return 2;
  }
  static char buf[PAGES * PAGE];
  for (int i = 0; i < PAGES * PAGE; i++)
    buf[i] = 'a' + i / PAGE;
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  /* Read-only: two pages, then six. */
  char *p = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  char *q = mremap(p, 2 * PAGE, 6 * PAGE, MREMAP_MAYMOVE);
  if (q == MAP_FAILED) {
    printf("read-only: mremap %s\n", strerror(errno));
  } else {
    printf("read-only: %c %c %c\n", q[0], q[3 * PAGE], q[5 * PAGE]);
    munmap(q, 6 * PAGE);
  }
  /* Writable: from page 1, two pages, then all seven to the end. */
  p = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, PAGE);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  p[0] = 'P';
  q = mremap(p, 2 * PAGE, 7 * PAGE, MREMAP_MAYMOVE);
  if (q == MAP_FAILED) {
    printf("writable: mremap %s\n", strerror(errno));
    return 0;
  }
  q[6 * PAGE] = 'Q';
  printf("writable: %c %c %c\n", q[0], q[4 * PAGE], q[6 * PAGE]);
  if (munmap(q, 7 * PAGE) != 0) {
    perror("munmap");
    return 1;
  }
  char at[3] = {0};
  if (syscall(SYS_pread64, fd, at, 1, PAGE) != 1 || syscall(SYS_pread64, fd, at + 1, 1, 7 * PAGE) != 1) {
    perror("pread");
    return 1;
  }
  printf("file: %s\n", at);
  return 0;
}
