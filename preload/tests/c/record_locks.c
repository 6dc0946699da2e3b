/* A POSIX record lock the program holds on a file stays held across a
 * mapping of the file and its munmap, as under the kernel alone, where a
 * munmap closes nothing. The shim's store has a descriptor of its own
 * for the file, and closing any descriptor of a file drops every POSIX
 * lock the process holds on it: the munmap dropped the program's lock
 * (sqlite remaps its database this way while it holds its locks). A
 * helper forked before the first mapping asks with F_GETLK after each
 * munmap; then the program closes its own descriptor, which drops the
 * lock under the kernel too.
 *
 * usage: record_locks FILE */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "util.h"

#define N 16

static int to[2], from[2];

/* The helper's answer: whether another process sees the first byte
 * locked. */
static const char *asked(void) {
  char r;
  if (write(to[1], "?", 1) != 1 || read(from[0], &r, 1) != 1) {
    perror("helper");
    exit(1);
  }
  return r == 'l' ? "held" : "gone";
}

int main(int argc, char **argv) {
  usage(argc, 1, "record_locks FILE");
  int fd = create_filled(argv[1], 'a', N * PAGE);
  if (pipe(to) != 0 || pipe(from) != 0) {
    perror("pipe");
    return 1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    close(to[1]);
    close(from[0]);
    int f = open(argv[1], O_RDWR);
    char c;
    while (read(to[0], &c, 1) == 1) {
      struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
      char r = fcntl(f, F_GETLK, &l) == 0 && l.l_type != F_UNLCK ? 'l' : 'u';
      if (write(from[1], &r, 1) != 1)
        _exit(1);
    }
    _exit(0);
  }
  close(to[0]);
  close(from[1]);
  struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(fd, F_SETLK, &l) != 0) {
    perror("F_SETLK");
    return 1;
  }
  for (int round = 1; round <= 2; round++) {
    char *p = map_or_exit(N * PAGE, PROT_READ, MAP_SHARED, fd, 0, "mmap");
    char first = p[0];
    if (munmap(p, N * PAGE) != 0) {
      perror("munmap");
      return 1;
    }
    printf("map %d read '%c'; after its munmap the lock is %s\n", round, first, asked());
  }
  close(fd);
  printf("after the program's close the lock is %s\n", asked());
  close(to[1]);
  waitpid(pid, NULL, 0);
  return 0;
}
