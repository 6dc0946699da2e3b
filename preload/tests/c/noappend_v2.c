/* pwritev2 with RWF_NOAPPEND on a descriptor opened O_APPEND writes at
 * its offset (or, with -1, at the descriptor's position), not at the end
 * of the file, over pages a writable shared mapping of the file dirtied:
 * the mapping shows the write, and its write-back does not undo it.
 *
 * usage: noappend_v2 FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include "util.h"

#ifndef RWF_NOAPPEND
#define RWF_NOAPPEND 0x20
#endif
#define LEN (4 * PAGE)

static void write_at(int fd, const char *what, const char *text, off_t off) {
  struct iovec v = {(void *)text, strlen(text)};
  ssize_t n = pwritev2(fd, &v, 1, off, RWF_NOAPPEND);
  printf("%s: %s\n", what, n < 0 ? strerror(errno) : "written");
}

static void file_at(int fd, const char *what, off_t off) {
  char got[7] = {0};
  if (syscall(SYS_pread64, fd, got, 6, off) != 6) {
    perror("pread");
    exit(1);
  }
  printf("%s: %s\n", what, got);
}

int main(int argc, char **argv) {
  usage(argc, 1, "noappend_v2 FILE");
  close(create_filled(argv[1], 'a', LEN));
  int fd = open(argv[1], O_RDWR | O_APPEND);
  if (fd < 0) {
    perror("open");
    return 1;
  }
  char *p = map_and_store(fd, LEN);
  write_at(fd, "RWF_NOAPPEND at an offset", "noapp1", PAGE + 100);
  if (lseek(fd, 200, SEEK_SET) != 200) {
    perror("lseek");
    return 1;
  }
  write_at(fd, "RWF_NOAPPEND at the position", "noapp2", -1);
  printf("mapping: %.6s %.6s %.6s %.6s\n", p + 10, p + 200, p + PAGE + 10, p + PAGE + 100);
  munmap(p, LEN);
  file_at(fd, "file at 10", 10);
  file_at(fd, "file at 200", 200);
  file_at(fd, "file at PAGE + 10", PAGE + 10);
  file_at(fd, "file at PAGE + 100", PAGE + 100);
  struct stat s;
  fstat(fd, &s);
  printf("length: %lld\n", (long long)s.st_size);
  return 0;
}
