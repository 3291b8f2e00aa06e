/* LD_PRELOAD hook for the setup-leak test (tests/shm/shm_driver.sh leak-setup): a process with
 * SHM_TEST_DIE_ON_ATTACH=1 in its environment SIGKILLs itself when it opens an existing
 * shared-memory object (shm_open without O_CREAT), i.e. right after rank 0 has created the
 * segment and before rank 0 has unlinked it: the window in which a lost peer must not make the
 * segment outlive the job. Every other shm_open goes to libc's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>

int shm_open(const char* name, int oflag, mode_t mode) {
  const char* die = getenv("SHM_TEST_DIE_ON_ATTACH");
  if (die && die[0] == '1' && !(oflag & O_CREAT)) raise(SIGKILL);
  int (*real)(const char*, int, mode_t) =
      (int (*)(const char*, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
  return real(name, oflag, mode);
}
