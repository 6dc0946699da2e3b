/* fsync after a store through a writable shared mapping: the bytes are in
 * the file when fsync returns (the kernel's fsync covers what was stored
 * through a mapping). Read back with a raw system call, which no
 * interposer sees.
 *
 * usage: fsync_mapped FILE */
#define _GNU_SOURCE
#include <sys/syscall.h>

#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 1, "fsync_mapped FILE");
  static char buf[4 * PAGE];
  memset(buf, 'a', sizeof buf);
  int fd = create_with(argv[1], 0, buf, sizeof buf);
  char *p = map_or_exit(sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
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
