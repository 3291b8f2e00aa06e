/* A downstream program: builds against an installed mtxcomm through find_package(mtxcomm) or
 * pkg-config and uses only the public C API (both installed headers: mtxcomm.h and the engines'
 * mtxcomm_engine.h). Run alone (one rank) or under mpirun. */
#include <mtxcomm/mtxcomm.h>
#include <mtxcomm/mtxcomm_engine.h>
#include <stdio.h>

#define COUNT 16

int main(void) {
  mtxcomm_comm_t comm = NULL;
  mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  if (rc != MTXCOMM_SUCCESS) {
    fprintf(stderr, "mtxcomm_comm_init_from_env: %s: %s\n", mtxcomm_get_error_string(rc),
            mtxcomm_get_last_error(NULL));
    return 1;
  }
  int rank = -1, size = -1, version = 0, cores = 0;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &size);
  mtxcomm_get_version(&version);
  mtxcomm_comm_cpu_share(comm, &cores);

  float data[COUNT];
  for (int i = 0; i < COUNT; ++i) data[i] = (float)(rank + 1) * (float)i;
  rc = mtxcomm_allreduce(data, data, COUNT, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, NULL);
  if (rc != MTXCOMM_SUCCESS) {
    fprintf(stderr, "mtxcomm_allreduce: %s\n", mtxcomm_get_last_error(comm));
    mtxcomm_comm_destroy(comm);
    return 1;
  }
  int wrong = 0;
  const float ranksSum = (float)(size * (size + 1) / 2);
  for (int i = 0; i < COUNT; ++i) wrong += data[i] != ranksSum * (float)i;
  printf("consumer rank %d of %d: mtxcomm %d, allreduce %s (data[%d] = %g)\n", rank, size, version,
         wrong ? "WRONG" : "ok", COUNT - 1, (double)data[COUNT - 1]);
  mtxcomm_comm_destroy(comm);
  return wrong || version != MTXCOMM_VERSION_CODE || cores < 1 ? 1 : 0;
}
