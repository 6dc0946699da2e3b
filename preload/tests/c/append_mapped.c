/* A writable shared mapping of a descriptor opened with O_APPEND (the
 * kernel allows it; O_APPEND governs write(2), not the mapping), and one
 * of a descriptor the program sets O_APPEND on afterwards: what is stored
 * through either lands at its page, and the file keeps its length. Read
 * back with raw system calls, which no interposer sees.
 *
 * usage: append_mapped FILE */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <sys/syscall.h>

#include "util.h"

#define LEN (4 * PAGE)

static int check(const char *name, const char *path, int open_flags, int later) {
  static char buf[LEN];
  memset(buf, 'a', sizeof buf);
  int fd = create_with(path, open_flags, buf, sizeof buf);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  if (later)
    set_o_append(fd);
  memcpy(p + PAGE + 10, "stored", 6);
  msync_or_exit(p, LEN);
  memcpy(p + 2 * PAGE + 10, "again!", 6);
  if (munmap(p, LEN) != 0) {
    perror("munmap");
    return 1;
  }
  struct stat st;
  char at[13] = {0};
  if (syscall(SYS_fstat, fd, &st) != 0 || syscall(SYS_pread64, fd, at, 6, PAGE + 10) != 6 ||
      syscall(SYS_pread64, fd, at + 6, 6, 2 * PAGE + 10) != 6) {
    perror("read back");
    return 1;
  }
  printf("%s: size %ld, at the pages %s\n", name, (long)st.st_size, at);
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  usage(argc, 1, "append_mapped FILE");
  return check("opened O_APPEND", argv[1], O_APPEND, 0) ||
         check("O_APPEND set later", argv[1], 0, 1);
}
