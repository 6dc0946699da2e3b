/* Forks with pager memory in the parent (a 32 MiB anonymous mapping over
 * the threshold, and FILE mapped shared), linked with atfork_lib.so,
 * whose fork child handler runs before the shim's and the engine's: it
 * maps and uses 32 MiB of its own, and writes a byte to FILE with
 * pwrite(2). Under the shim that handler reached the pager as if in the
 * parent: the engine's ioctls acted on the parent's address space, whose
 * memory changed. The engine now marks a fork under way before any child
 * handler runs and refuses the child's calls, and the shim passes them to
 * the kernel.
 *
 * usage: atfork_first FILE */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>

#include "util.h"

#define LEN (32 << 20)

extern int atfork_lib_result, atfork_lib_fd, atfork_lib_wrote;

int main(int argc, char **argv) {
  usage(argc, 1, "atfork_first FILE");
  alarm(60); /* (should the parent itself hang) */
  int fd = create_filled(argv[1], 'a', 4 * PAGE);
  char *f = map_or_exit(4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  if (f[0] != 'a')
    return 5;
  atfork_lib_fd = fd;
  char *a = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "mmap");
  for (long i = 0; i < LEN; i += 4096)
    a[i] = (char)(i >> 13);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    return 3;
  if (pid == 0) {
    const char *what[] = {"its memory held what it stored", "its mapping failed",
                          "its memory read back wrong"};
    printf("child handler: %s; its write %s\n",
           atfork_lib_result < 0 ? "did not run" : what[atfork_lib_result],
           atfork_lib_wrote == 1 ? "made" : "failed");
    fflush(stdout);
    _exit(0);
  }
  /* A child that hangs (in the handler, before fork returns there) is
   * killed after 20 s and reported. */
  int status, waited = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (++waited > 2000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      printf("child hung\n");
      return 0;
    }
    usleep(10000);
  }
  int ok = 1;
  for (long i = 0; i < LEN; i += 4096)
    ok &= a[i] == (char)(i >> 13);
  char c = 0;
  if (pread(fd, &c, 1, 0) != 1)
    return 6;
  printf("child %s; parent's memory %s; the file's first byte %c\n",
         WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "exited 0" : "failed",
         ok ? "intact" : "changed", c);
  return 0;
}
