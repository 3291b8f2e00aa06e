/* Builds a communicator with mtxcomm_comm_init_from_env and prints the outcome on stdout:
 *   result <code> (<error string>): <mtxcomm_get_last_error>
 * The bad-configuration tests set one MTXCOMM_* variable and match this line (and the library's
 * warnings on stderr) with PASS_REGULAR_EXPRESSION. Exits 0 if init succeeded. */
#include <stdio.h>

#include "mtxcomm/mtxcomm.h"

int main(void) {
  mtxcomm_comm_t comm = NULL;
  mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  printf("result %d (%s): %s\n", (int)rc, mtxcomm_get_error_string(rc),
         rc == MTXCOMM_SUCCESS ? "" : mtxcomm_get_last_error(NULL));
  mtxcomm_comm_destroy(comm);
  return rc == MTXCOMM_SUCCESS ? 0 : 1;
}
