/* A descriptor opened O_RDONLY, mapped PROT_READ|PROT_WRITE and
 * MAP_SHARED: the kernel answers EACCES (a store through the mapping would
 * write a file the descriptor gives no right to write), and the file keeps
 * its bytes.
 *
 * usage: read_only_shared_write FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 1, "read_only_shared_write FILE");
  char buf[2 * PAGE];
  memset(buf, '.', sizeof buf);
  int w = create_with(argv[1], 0, buf, sizeof buf);
  close(w);
  int fd = open(argv[1], O_RDONLY);
  if (fd < 0) {
    perror("open");
    return 1;
  }
  char *p = mmap(NULL, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    printf("writable shared of O_RDONLY: %s\n", strerror(errno));
  } else {
    printf("writable shared of O_RDONLY: mapped\n");
    p[0] = 'X';
    if (munmap(p, sizeof buf) != 0) {
      perror("munmap");
      return 1;
    }
  }
  char c = 0;
  if (pread(fd, &c, 1, 0) != 1) {
    perror("pread");
    return 1;
  }
  printf("the file starts with '%c'\n", c);
  return 0;
}
