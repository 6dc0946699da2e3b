/* A UMap program whose main thread exits while another thread's uunmap
 * is writing a region's stores back: the exit waits for it, and every
 * store reaches the file.
 *
 * usage: umap_exit_during_uunmap FILE */
#include <umap/umap.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PAGES 16384
#define PAGE 4096

static char *w;

static void *unmap(void *arg) {
  (void)arg;
  if (uunmap(w, (size_t)PAGES * PAGE) != 0)
    perror("uunmap");
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  static char page[PAGE];
  memset(page, 'a', sizeof page);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    perror("create");
    return 1;
  }
  for (int i = 0; i < PAGES; i++)
    if (write(fd, page, PAGE) != PAGE) {
      perror("write");
      return 1;
    }
  w = umap(NULL, (size_t)PAGES * PAGE, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  if (w == UMAP_FAILED) {
    perror("umap");
    return 1;
  }
  for (int i = 0; i < PAGES; i++)
    w[(size_t)i * PAGE] = 's';
  pthread_t t;
  if (pthread_create(&t, NULL, unmap, NULL) != 0)
    return 1;
  usleep(2000);
  return 0; /* exit while the uunmap writes back */
}
