/* UMap's messages go to stderr; with stderr's reader gone (EPIPE, SIGPIPE
 * ignored, as many servers run) a message must not abort the program.
 *
 * usage: umap_broken_stderr   (stderr a pipe whose reader has gone) */
#include <umap/umap.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  /* The harness closes the reading end; give it the time to. */
  usleep(300 * 1000);
  umapcfg_set_umap_page_size(3); /* refused, with a message */
  void *p = umap(NULL, 0, PROT_READ, UMAP_PRIVATE, -1, 0); /* refused too */
  printf("page size %llu, umap %s (errno %d)\n",
         (unsigned long long)umapcfg_get_umap_page_size(),
         p == UMAP_FAILED ? "failed" : "mapped", errno);
  return 0;
}
