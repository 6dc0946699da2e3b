/* mprotect with protection bits the kernel refuses before it changes
 * anything: an unknown bit (EINVAL), and PROT_GROWSDOWN on a mapping that
 * does not grow down (EINVAL). The shim took either over a whole pager
 * mapping as a plain PROT_READ, and answered 0.
 *
 * usage: mprotect_bad_prot FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

static void try_prot(const char *what, char *p, int prot) {
  errno = 0;
  int r = mprotect(p, LEN, prot);
  printf("%s: mprotect %d %s\n", what, r, r == 0 ? "" : errno == EINVAL ? "EINVAL" : "other");
}

int main(int argc, char **argv) {
  usage(argc, 1, "mprotect_bad_prot FILE");
  int fd = create_filled(argv[1], 'b', LEN);
  char *p = map_or_exit(LEN, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  try_prot("unknown bit", p, PROT_READ | 0x10000);
  try_prot("growsdown", p, PROT_READ | PROT_GROWSDOWN);
  try_prot("plain", p, PROT_READ);
  printf("first %c\n", p[0]);
  return 0;
}
