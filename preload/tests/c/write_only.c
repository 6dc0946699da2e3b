/* mmap of a descriptor opened O_WRONLY: the kernel refuses every kind
 * (EACCES), since a mapping must read its file. Then, on a descriptor
 * opened O_RDWR, the file maps and reads as usual.
 *
 * usage: write_only FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (4 * 4096)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: write_only FILE\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  static char buf[LEN];
  memset(buf, 'w', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  close(fd);
  int wo = open(argv[1], O_WRONLY);
  const char *kinds[] = {"read-only shared", "writable shared", "read-only private"};
  int prots[] = {PROT_READ, PROT_READ | PROT_WRITE, PROT_READ};
  int flags[] = {MAP_SHARED, MAP_SHARED, MAP_PRIVATE};
  for (int i = 0; i < 3; i++) {
    volatile char *p = mmap(NULL, LEN, prots[i], flags[i], wo, 0);
    if (p == MAP_FAILED) {
      printf("%s: %s\n", kinds[i], strerror(errno));
    } else {
      printf("%s: mapped, reads %c\n", kinds[i], p[4096]);
      munmap((void *)p, LEN);
    }
  }
  int rw = open(argv[1], O_RDWR);
  volatile char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  if (p == MAP_FAILED) {
    perror("mmap O_RDWR");
    return 1;
  }
  printf("O_RDWR: reads %c\n", p[4096]);
  return 0;
}
