#include "lib/base/membarrier.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mtxcomm {
namespace {

long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

// Registers for cmd (with its register command) when the kernel offers it.
bool registerFor(int cmd, int registerCmd) {
  const long cmds = membarrier(MEMBARRIER_CMD_QUERY);
  return cmds >= 0 && (cmds & cmd) && membarrier(registerCmd) == 0;
}

}  // namespace

bool registerGlobalMembarrier() {
  static const bool ok =
      registerFor(MEMBARRIER_CMD_GLOBAL_EXPEDITED, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED);
  return ok;
}

void globalMembarrier() { membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED); }

bool registerPrivateMembarrier() {
  static const bool ok =
      registerFor(MEMBARRIER_CMD_PRIVATE_EXPEDITED, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
  return ok;
}

bool privateMembarrier() { return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0; }

}  // namespace mtxcomm
