/* A writable shared mapping of a descriptor opened with O_APPEND (the
 * kernel allows it; O_APPEND governs write(2), not the mapping), and one
 * of a descriptor the program sets O_APPEND on afterwards: what is stored
 * through either lands at its page, and the file keeps its length. Read
 * back with raw system calls, which no interposer sees.
 *
 * usage: append_mapped FILE */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096
#define LEN (4 * PAGE)

static int check(const char *name, const char *path, int open_flags, int later) {
  static char buf[LEN];
  memset(buf, 'a', sizeof buf);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | open_flags, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  if (later && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_APPEND) != 0) {
    perror("fcntl");
    return 1;
  }
  memcpy(p + PAGE + 10, "stored", 6);
  if (msync(p, LEN, MS_SYNC) != 0) {
    perror("msync");
    return 1;
  }
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
  if (argc != 2) {
    fprintf(stderr, "usage: append_mapped FILE\n");
    return 2;
  }
  return check("opened O_APPEND", argv[1], O_APPEND, 0) ||
         check("O_APPEND set later", argv[1], 0, 1);
}
