/* MADV_REMOVE on two pages of a writable shared file mapping, one stored
 * to and one clean: the kernel punches the file (the pages and the file
 * read zeros). Passed on by the shim, it punched the engine's memfd: the
 * stored page came out right by chance (its punched, dirty page was
 * written back as zeros), but the clean one was read from the file again,
 * and the file kept its bytes. The shim refuses the call now (EOPNOTSUPP,
 * the kernel's answer where a file system cannot punch holes), and the
 * pages and the file keep their bytes.
 *
 * usage: madv_remove FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

static const char *what(char c) {
  return c == 0 ? "zero" : c == 'b' ? "b" : c == 'a' ? "a" : "other";
}

int main(int argc, char **argv) {
  usage(argc, 1, "madv_remove FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  p[PAGE] = 'b';
  int r = madvise(p + PAGE, 2 * PAGE, MADV_REMOVE);
  int e = r == 0 ? 0 : errno;
  char c[2] = {0, 0};
  if (pread(fd, &c[0], 1, (off_t)PAGE) != 1 || pread(fd, &c[1], 1, (off_t)2 * PAGE) != 1)
    return 1;
  printf("madvise %s; stored page: mapped %s, file %s; clean page: mapped %s, file %s\n",
         r == 0 ? "0" : e == EOPNOTSUPP ? "EOPNOTSUPP" : "other", what(p[PAGE]), what(c[0]),
         what(p[2 * PAGE]), what(c[1]));
  return 0;
}
