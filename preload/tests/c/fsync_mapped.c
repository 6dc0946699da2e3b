/* fsync after a store through a writable shared mapping: the bytes are in
 * the file when fsync returns (the kernel's fsync covers what was stored
 * through a mapping). Read back with a raw system call, which no
 * interposer sees.
 *
 * usage: fsync_mapped FILE */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fsync_mapped FILE\n");
    return 2;
  }
  static char buf[4 * PAGE];
  memset(buf, 'a', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memcpy(p + PAGE + 10, "synced", 6);
  if (fsync(fd) != 0) {
    perror("fsync");
    return 1;
  }
  char back[7] = {0};
  if (syscall(SYS_pread64, fd, back, 6, PAGE + 10) != 6) {
    perror("pread");
    return 1;
  }
  printf("after-fsync %s\n", back);
  return 0;
}
