/* A file shorter than its page, mapped writable and shared; the program
 * grows it with pwrite(2) past the end of that page's bytes, then stores
 * through the mapping between the old end and the new one: the kernel's
 * mapping writes those stores to the file. Read back with raw system
 * calls, which no interposer sees.
 *
 * usage: grown_then_stored FILE */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: grown_then_stored FILE\n");
    return 2;
  }
  char a[100];
  memset(a, 'a', sizeof a);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  p[10] = 'b';
  if (pwrite(fd, "z", 1, 4095) != 1) { /* the file is a page long now */
    perror("pwrite");
    return 1;
  }
  memcpy(p + 2000, "stored", 6);
  if (msync(p, 4096, MS_SYNC) != 0) {
    perror("msync");
    return 1;
  }
  struct stat st;
  char at10 = 0, at[7] = {0};
  if (syscall(SYS_fstat, fd, &st) != 0 || syscall(SYS_pread64, fd, &at10, 1, 10) != 1 ||
      syscall(SYS_pread64, fd, at, 6, 2000) != 6) {
    perror("read back");
    return 1;
  }
  printf("size %ld, at 10: %c, at 2000: '%s', mapping at 4095: %c\n", (long)st.st_size, at10,
         at, p[4095]);
  munmap(p, 4096);
  return 0;
}
