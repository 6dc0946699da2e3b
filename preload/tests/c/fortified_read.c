/* Stores through a writable shared mapping, then read(2) and pread(2)
 * into stack buffers of a size the compiler knows and a length it does
 * not: built with -D_FORTIFY_SOURCE=2 (as distributions build, and as
 * Debian's and Ubuntu's gcc -O2 does by default), these calls are
 * __read_chk and __pread_chk (__pread64_chk with _FILE_OFFSET_BITS=64).
 * A length larger than the buffer ends the program (glibc's
 * "buffer overflow detected"), with the shim too.
 *
 * usage: fortified_read FILE LEN */
#define _GNU_SOURCE
#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 2, "fortified_read FILE LEN");
  size_t n = (size_t)atoi(argv[2]);
  int fd = create_filled(argv[1], 'a', 8192);
  map_and_store(fd, 8192);
  char b1[16] = {0}, b2[16] = {0};
  if (pread(fd, b1, n, 10) != (ssize_t)n || lseek(fd, 4096 + 10, SEEK_SET) < 0 ||
      read(fd, b2, n) != (ssize_t)n) {
    perror("read");
    return 1;
  }
  printf("pread: %s, read: %s\n", b1, b2);
  return 0;
}
