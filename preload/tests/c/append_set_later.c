/* A file the program opened for writing and then made read-only
 * (fchmod 0444), so that it cannot be opened for writing again; mapped
 * writable and shared, and O_APPEND set on the descriptor afterwards
 * (which governs write(2), not the mapping): what is stored through the
 * mapping lands at its page, and the file keeps its length. As root the
 * program runs as uid 65534 (root opens any file again). Read back with
 * raw system calls, which no interposer sees.
 *
 * usage: append_set_later FILE */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <sys/syscall.h>

#include "util.h"

#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "append_set_later FILE");
  static char a[LEN];
  memset(a, 'a', sizeof a);
  unlink(argv[1]);
  int fd = create_with(argv[1], 0, a, sizeof a);
  if (geteuid() == 0) {
    close(fd);
    if (chown(argv[1], 65534, 65534) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      perror("to uid 65534");
      return 1;
    }
    fd = open(argv[1], O_RDWR);
  }
  if (fd < 0 || fchmod(fd, 0444) != 0) {
    perror("open, fchmod");
    return 1;
  }
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  set_o_append(fd);
  memcpy(p + PAGE + 10, "stored", 6);
  msync_or_exit(p, LEN);
  struct stat st;
  char at[7] = {0};
  if (syscall(SYS_fstat, fd, &st) != 0 || syscall(SYS_pread64, fd, at, 6, PAGE + 10) != 6) {
    perror("read back");
    return 1;
  }
  printf("size %ld, at the page: %s\n", (long)st.st_size, at);
  return 0;
}
