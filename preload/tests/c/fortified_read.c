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
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fortified_read FILE LEN\n");
    return 2;
  }
  size_t n = (size_t)atoi(argv[2]);
  static char a[8192];
  memset(a, 'a', sizeof a);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, sizeof a, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memcpy(p + 10, "stored", 6);
  memcpy(p + 4096 + 10, "again!", 6);
  char b1[16] = {0}, b2[16] = {0};
  if (pread(fd, b1, n, 10) != (ssize_t)n || lseek(fd, 4096 + 10, SEEK_SET) < 0 ||
      read(fd, b2, n) != (ssize_t)n) {
    perror("read");
    return 1;
  }
  printf("pread: %s, read: %s\n", b1, b2);
  return 0;
}
