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
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096
#define LEN (4 * PAGE)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: append_set_later FILE\n");
    return 2;
  }
  static char a[LEN];
  memset(a, 'a', sizeof a);
  unlink(argv[1]);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a) {
    perror("create");
    return 1;
  }
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
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_APPEND) != 0) {
    perror("fcntl");
    return 1;
  }
  memcpy(p + PAGE + 10, "stored", 6);
  if (msync(p, LEN, MS_SYNC) != 0) {
    perror("msync");
    return 1;
  }
  struct stat st;
  char at[7] = {0};
  if (syscall(SYS_fstat, fd, &st) != 0 || syscall(SYS_pread64, fd, at, 6, PAGE + 10) != 6) {
    perror("read back");
    return 1;
  }
  printf("size %ld, at the page: %s\n", (long)st.st_size, at);
  return 0;
}
