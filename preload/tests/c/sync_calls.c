/* Stores through a writable shared mapping, each followed by one of the
 * whole-system or range sync calls (sync, syncfs, sync_file_range) and a
 * read of the file with a raw system call, which no interposer sees:
 * under the kernel the stores are in the page cache those calls write.
 * The shim did not interpose them: the file kept the older bytes.
 *
 * usage: sync_calls FILE */
#define _GNU_SOURCE
#include <sys/syscall.h>

#include "util.h"

#define LEN (4 * PAGE)

static void show(int fd, int page, const char *after) {
  char buf[7] = {0};
  if (syscall(SYS_pread64, fd, buf, 6, (off_t)page * PAGE) != 6)
    exit(1);
  printf("after %s: %s\n", after, buf);
}

int main(int argc, char **argv) {
  usage(argc, 1, "sync_calls FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + PAGE, "sync!!", 6);
  sync();
  show(fd, 1, "sync");
  memcpy(p + 2 * PAGE, "syncfs", 6);
  if (syncfs(fd) != 0) {
    perror("syncfs");
    return 1;
  }
  show(fd, 2, "syncfs");
  memcpy(p + 3 * PAGE, "range!", 6);
  if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE) != 0) {
    perror("sync_file_range");
    return 1;
  }
  show(fd, 3, "sync_file_range");
  return 0;
}
