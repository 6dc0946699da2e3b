/* The C tests' one assertion: on failure, the place, the condition and the
 * pager's last error, then exit(1). */
#ifndef UFFD_PAGER_TEST_CHECK_H
#define UFFD_PAGER_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <uffd_pager.h>

#define CHECK(c)                                                              \
  do {                                                                        \
    if (!(c)) {                                                               \
      fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, #c,             \
              uffd_pager_last_error());                                       \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

#endif
