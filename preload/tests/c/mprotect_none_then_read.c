/* A private anonymous mapping made PROT_NONE, then PROT_READ: it reads
 * what was written, and a write to it faults (SIGSEGV), as the kernel's.
 *
 * usage: mprotect_none_then_read */
#define _GNU_SOURCE
#include "util.h"

#define LEN ((size_t)16 << 20)

int main(int argc, char **argv) {
  usage(argc, 0, "mprotect_none_then_read");
  (void)argv;
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "mmap");
  p[5 * PAGE] = 'w';
  if (mprotect(p, LEN, PROT_NONE) != 0 || mprotect(p, LEN, PROT_READ) != 0) {
    perror("mprotect");
    return 1;
  }
  /* (A read that faulted would end the program: the output says so.) */
  char c = p[5 * PAGE];
  int wrote = try_store(&p[6 * PAGE], 'x');
  printf("read '%c', write %s\n", c ? c : '-', wrote ? "allowed" : "refused");
  return 0;
}
