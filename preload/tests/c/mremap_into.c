/* mremap(MREMAP_MAYMOVE | MREMAP_FIXED) of a shared file mapping into a
 * range the program reserved for it (PROT_NONE anonymous memory): the
 * kernel's move replaces what is at the target. The moved mapping keeps
 * its bytes, and the stores through it reach the file.
 *
 * usage: mremap_into FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>

#include "util.h"

#define PAGES 8
#define LEN (PAGES * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "mremap_into FILE");
  static char buf[LEN];
  for (int i = 0; i < LEN; i++)
    buf[i] = 'a' + i / PAGE;
  int fd = create_with(argv[1], 0, buf, sizeof buf);
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  char *res = mmap(NULL, 3 * LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED || res == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  p[0] = 'P';
  char *to = res + LEN;
  char *q = mremap(p, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  if (q == MAP_FAILED) {
    printf("mremap: %s\n", strerror(errno));
    return 0;
  }
  printf("moved %s: %c %c\n", q == to ? "to the target" : "elsewhere", q[0], q[5 * PAGE]);
  q[5 * PAGE] = 'Q';
  if (munmap(q, LEN) != 0) {
    perror("munmap");
    return 1;
  }
  char at[3] = {0};
  if (syscall(SYS_pread64, fd, at, 1, 0) != 1 || syscall(SYS_pread64, fd, at + 1, 1, 5 * PAGE) != 1) {
    perror("pread");
    return 1;
  }
  printf("file: %s\n", at);
  return 0;
}
