/* Stores through a writable shared mapping of a file, then an exec with
 * neither msync nor munmap: the new image reads the stores from the file,
 * as under the kernel, whose page cache keeps them. The shim wrote back
 * at exit only, which an exec never reaches: the new image read the
 * older bytes. HOW names the exec call (execve, execv, execvp, execvpe,
 * fexecve, execveat); the new image is this program again, which prints
 * the file's first bytes, read with a raw system call.
 *
 * usage: exec_with_stores FILE HOW */
#define _GNU_SOURCE
#include <sys/syscall.h>

#include "util.h"

#define LEN (4 * PAGE)

extern char **environ;

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[3], "read") == 0) {
    int fd = open(argv[1], O_RDONLY);
    char buf[7] = {0};
    if (fd < 0 || syscall(SYS_pread64, fd, buf, 6, (off_t)PAGE + 10) != 6)
      return 1;
    printf("after %s: %s\n", argv[2], buf);
    return 0;
  }
  usage(argc, 2, "exec_with_stores FILE HOW");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + PAGE + 10, "stored", 6);
  char *args[] = {argv[0], argv[1], argv[2], "read", NULL};
  const char *how = argv[2];
  fflush(stdout);
  if (strcmp(how, "execve") == 0) {
    execve(argv[0], args, environ);
  } else if (strcmp(how, "execv") == 0) {
    execv(argv[0], args);
  } else if (strcmp(how, "execvp") == 0) {
    execvp(argv[0], args);
  } else if (strcmp(how, "execvpe") == 0) {
    execvpe(argv[0], args, environ);
  } else if (strcmp(how, "fexecve") == 0) {
    int self = open(argv[0], O_RDONLY);
    fexecve(self, args, environ);
  } else if (strcmp(how, "execveat") == 0) {
    execveat(AT_FDCWD, argv[0], args, environ, 0);
  } else {
    fprintf(stderr, "unknown HOW %s\n", how);
    return 2;
  }
  perror(how);
  return 1;
}
