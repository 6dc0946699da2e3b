/* Stores through a writable shared mapping of FILE in main, and hands a
 * page of it to a library's destructor (dtor_lib.c), which stores there
 * after main has returned, as a logging or database library flushing its
 * buffers at exit would. Both stores must reach the file: the kernel
 * writes a shared mapping back whenever its process stores.
 *
 * usage: dtor_store FILE */
#define _GNU_SOURCE
#include "util.h"

#define LEN (16 * PAGE)

extern char *dtor_lib_at;

int main(int argc, char **argv) {
  usage(argc, 1, "dtor_store FILE");
  int fd = create_filled(argv[1], 0, LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p, "main", 4);
  dtor_lib_at = p + 8 * PAGE;
  printf("stored\n");
  return 0;
}
