/* MADV_DOFORK on a shared file mapping four times the budget, every page
 * read once (so the pager has dropped most of them), then fork: the child
 * checks every page. Passed on by the shim, the call undid the engine's
 * MADV_DONTFORK, and the child got the engine's memfd mapping with no
 * pager behind it: the pages the pager had dropped read as zeros. The
 * shim refuses it now (EINVAL, the kernel's answer for a mapping it will
 * not copy into a child), and no child sees a wrong page.
 *
 * usage: madv_dofork FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/wait.h>

#include "util.h"

#define PAGES 1024
#define LEN (PAGES * PAGE)

static char letter(int i) { return (char)('a' + i % 26); }

int main(int argc, char **argv) {
  usage(argc, 1, "madv_dofork FILE");
  int fd = create_filled(argv[1], 0, LEN);
  for (int i = 0; i < PAGES; i++) {
    char c = letter(i);
    if (pwrite(fd, &c, 1, (off_t)i * PAGE) != 1)
      return 1;
  }
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  for (int i = 0; i < PAGES; i++)
    if (p[(size_t)i * PAGE] != letter(i))
      return 2;
  int r = madvise(p, LEN, MADV_DOFORK);
  if (r != 0) {
    printf("madvise %s\n", errno == EINVAL ? "EINVAL" : "other");
    return 0;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    return 3;
  if (pid == 0) {
    int wrong = 0;
    for (int i = 0; i < PAGES; i++)
      wrong += p[(size_t)i * PAGE] != letter(i);
    printf("madvise 0; child: %s\n", wrong ? "wrong pages" : "every page right");
    fflush(stdout);
    _exit(0);
  }
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return 4;
  return 0;
}
