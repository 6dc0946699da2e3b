/* Stores through a writable shared mapping of a file, then another
 * process started with fork, posix_spawn, posix_spawnp, system or popen,
 * with neither msync nor munmap: the child reads the stores from the
 * file, as under the kernel, whose page cache keeps them. The shim wrote
 * back at exec and exit only, which the parent reaches neither of (a
 * fork()ed child's copy of the shim serves nothing, and glibc's spawn
 * calls exec through its own internal calls): the child read the older
 * bytes. HOW names the call; the child is this program again (or, with
 * fork, its child branch), which prints the bytes stored, read with a raw
 * system call. The parent prints its errno after the call (set to 1234
 * before it): the write-back keeps it.
 *
 * usage: spawn_with_stores FILE HOW */
#define _GNU_SOURCE
#include <errno.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "util.h"

#define LEN (4 * PAGE)

extern char **environ;

static int show(const char *path, const char *how) {
  int fd = open(path, O_RDONLY);
  char buf[7] = {0};
  if (fd < 0 || syscall(SYS_pread64, fd, buf, 6, (off_t)PAGE + 10) != 6)
    return 1;
  printf("after %s: %s\n", how, buf);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[3], "read") == 0)
    return show(argv[1], argv[2]);
  usage(argc, 2, "spawn_with_stores FILE HOW");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + PAGE + 10, "stored", 6);
  const char *how = argv[2];
  char *args[] = {argv[0], argv[1], argv[2], "read", NULL};
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' read", argv[0], argv[1], how);
  fflush(stdout);
  pid_t pid = -1;
  int status = 0;
  int e = 0;
  errno = 1234;
  if (strcmp(how, "fork") == 0) {
    pid = fork();
    if (pid == 0)
      _exit(show(argv[1], how));
    e = errno;
  } else if (strcmp(how, "posix_spawn") == 0) {
    if (posix_spawn(&pid, argv[0], NULL, NULL, args, environ) != 0)
      return 1;
    e = errno;
  } else if (strcmp(how, "posix_spawnp") == 0) {
    if (posix_spawnp(&pid, argv[0], NULL, NULL, args, environ) != 0)
      return 1;
    e = errno;
  } else if (strcmp(how, "system") == 0) {
    int r = system(cmd);
    e = errno;
    printf("errno %d\n", e);
    return r == 0 ? 0 : 1;
  } else if (strcmp(how, "popen") == 0) {
    FILE *f = popen(cmd, "r");
    e = errno;
    char line[64] = {0};
    if (f == NULL || fgets(line, sizeof line, f) == NULL)
      return 1;
    fputs(line, stdout);
    printf("errno %d\n", e);
    return pclose(f) == 0 ? 0 : 1;
  } else {
    fprintf(stderr, "unknown HOW %s\n", how);
    return 2;
  }
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return 1;
  printf("errno %d\n", e);
  return WEXITSTATUS(status);
}
