/* A file stored to through its writable shared mapping, then mapped again
 * with a protection the shim leaves to the kernel (PROT_EXEC, private or
 * shared): each new mapping shows the stores, as without the shim.
 *
 * usage: exec_after_stores FILE */
#define _GNU_SOURCE
#include "util.h"

#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "exec_after_stores FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + 10, "stored", 6);
  char *x = map_or_exit(LEN, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0, "mmap PROT_EXEC private");
  printf("PROT_EXEC private: %.6s\n", x + 10);
  memcpy(p + PAGE + 10, "again!", 6);
  char *w = map_or_exit(LEN, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0, "mmap PROT_EXEC shared");
  printf("PROT_EXEC shared: %.6s\n", w + PAGE + 10);
  munmap(x, LEN);
  munmap(w, LEN);
  munmap(p, LEN);
  return 0;
}
