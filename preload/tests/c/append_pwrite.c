/* pwrite on a descriptor opened with O_APPEND: Linux appends, whatever the
 * offset says. The bytes land past the old end of the file, in the last
 * page a shared mapping of it shows, and the mapping must show them.
 *
 * usage: append_pwrite FILE */
#define _GNU_SOURCE
#include "util.h"

#define OLD_LEN (2 * PAGE + 100)

int main(int argc, char **argv) {
  usage(argc, 1, "append_pwrite FILE");
  int fd = create_filled(argv[1], 'a', OLD_LEN);
  const volatile char *p = map_or_exit(3 * PAGE, PROT_READ, MAP_SHARED, fd, 0, "mmap");
  /* The last page is read (and cached) before the append. */
  char before = p[2 * PAGE + 50];
  int afd = open(argv[1], O_WRONLY | O_APPEND);
  if (afd < 0 || pwrite(afd, "tail", 4, 0) != 4) {
    perror("pwrite");
    return 1;
  }
  char seen[5] = {0}, head[5] = {0};
  for (int i = 0; i < 4; i++) {
    seen[i] = p[OLD_LEN + i] ? p[OLD_LEN + i] : '0';
    head[i] = p[i];
  }
  printf("before %c past-the-old-end %s head %s size %ld\n", before, seen, head,
         (long)lseek(fd, 0, SEEK_END));
  return 0;
}
