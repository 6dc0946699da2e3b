/* mremap(MREMAP_MAYMOVE|MREMAP_FIXED) of a file mapping into a range the
 * program reserved and wrote, growing it past the end of the file: the
 * kernel moves it (its pages past the end are SIGBUS); the shim refuses
 * it (EINVAL, as its README says), and then the reserved range must be
 * as it was.
 *
 * usage: mremap_refused FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>

#include "util.h"

static sigjmp_buf jb;
static void segv(int s) {
  (void)s;
  siglongjmp(jb, 1);
}

int main(int argc, char **argv) {
  usage(argc, 1, "mremap_refused FILE");
  int fd = create_filled(argv[1], 'f', 2 * PAGE);
  char *p = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, fd, 0);
  char *r = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || r == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(r, 'r', 8 * PAGE);
  char *q = mremap(p, 2 * PAGE, 8 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, r);
  if (q != MAP_FAILED) {
    printf("moved: '%c'\n", q[0]);
    return 0;
  }
  printf("mremap: %s\n", strerror(errno));
  signal(SIGSEGV, segv);
  if (sigsetjmp(jb, 1) == 0)
    printf("the reserved range: '%c', the mapping: '%c'\n", r[3 * PAGE], p[PAGE]);
  else
    printf("the reserved range: gone (SIGSEGV)\n");
  return 0;
}
