/* A shared library with a destructor that stores "late" at the address the
 * program set: it is finalised after an LD_PRELOAD library (whose
 * destructor runs first), so the store comes after the shim's own
 * destructor. Built with -shared -fPIC (dtor_store.c). */
#include <string.h>

char *dtor_lib_at = 0;

__attribute__((destructor)) static void fini(void) {
  if (dtor_lib_at)
    memcpy(dtor_lib_at, "late", 4);
}
