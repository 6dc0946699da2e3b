/* A file shorter than its page, mapped writable and shared; the program
 * grows it with pwrite(2) past the end of that page's bytes, then stores
 * through the mapping between the old end and the new one: the kernel's
 * mapping writes those stores to the file. Read back with raw system
 * calls, which no interposer sees.
 *
 * usage: grown_then_stored FILE */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <sys/syscall.h>

#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 1, "grown_then_stored FILE");
  char a[100];
  memset(a, 'a', sizeof a);
  int fd = create_with(argv[1], 0, a, sizeof a);
  char *p = map_or_exit(4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
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
