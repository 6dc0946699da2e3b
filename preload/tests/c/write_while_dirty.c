/* A program that keeps storing to a writable shared mapping of a file and
 * writes one page of the same file with pwrite(2) after each round of
 * stores: what the file holds at the end, read back with a raw system
 * call (which no interposer sees), is printed as one line per page.
 *
 * usage: write_while_dirty FILE */
#define _GNU_SOURCE
#include <sys/syscall.h>

#include "util.h"

#define PAGES 16
#define ROUNDS 20

int main(int argc, char **argv) {
  usage(argc, 1, "write_while_dirty FILE");
  static char buf[PAGES * PAGE];
  int fd = create_with(argv[1], 0, buf, sizeof buf);
  char *p = map_or_exit(sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  for (int r = 0; r < ROUNDS; r++) {
    memset(p, 'a' + r, sizeof buf);
    char note[8];
    snprintf(note, sizeof note, "X%02d", r);
    if (pwrite(fd, note, 3, (PAGES - 1) * PAGE + 100) != 3) {
      perror("pwrite");
      return 1;
    }
    if (memcmp(p + (PAGES - 1) * PAGE + 100, note, 3) != 0) {
      printf("round %d: the mapping does not show the pwrite\n", r);
      return 1;
    }
  }
  if (msync(p, sizeof buf, MS_SYNC) != 0) {
    perror("msync");
    return 1;
  }
  if (syscall(SYS_pread64, fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf) {
    perror("pread");
    return 1;
  }
  for (int i = 0; i < PAGES; i++) {
    int same = 1;
    for (int k = 1; k < PAGE; k++)
      same &= buf[i * PAGE + k] == buf[i * PAGE];
    printf("page %d: %c%s %.3s\n", i, buf[i * PAGE], same ? " only" : "",
           buf + i * PAGE + 100);
  }
  return 0;
}
