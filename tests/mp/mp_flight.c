/* A job that hangs or disagrees, for the flight recorder (tests/mp/mp_flight.sh). Public C API
 * only, under mpirun. Every rank makes five labelled allreduces ("step 1".."step 5"), then:
 *   stop   ranks 0..n-2 make a sixth; rank n-1 never does: it waits until its own record is in
 *          DIR (written on the SIGUSR1 a failing peer sends) or 30 s, and exits. The others
 *          fail at MTXCOMM_TIMEOUT, which writes their records.
 *   count  the sixth allreduce has 256 floats on every rank but the last, which passes 255.
 * Prints "rank R: sixth call <code>" and "rank R: record written" (stop, last rank); every rank
 * waits for every record before it exits. Exit 0.
 * usage: mp_flight stop|count DIR */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtxcomm/mtxcomm.h"

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "stop") != 0 && strcmp(argv[1], "count") != 0)) {
    fprintf(stderr, "usage: mp_flight stop|count DIR\n");
    return 2;
  }
  const int stop = strcmp(argv[1], "stop") == 0;
  mtxcomm_comm_t comm = NULL;
  if (mtxcomm_comm_init_from_env(&comm) != MTXCOMM_SUCCESS) {
    printf("FAIL: init: %s\n", mtxcomm_get_last_error(NULL));
    return 1;
  }
  int rank = 0, size = 0;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &size);
  float buf[256];
  for (int step = 1; step <= 5; ++step) {
    char label[32];
    snprintf(label, sizeof(label), "step %d", step);
    for (int i = 0; i < 256; ++i) buf[i] = (float)rank;
    mtxcomm_comm_set_call_label(comm, label);
    if (mtxcomm_allreduce(buf, buf, 256, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, NULL) !=
        MTXCOMM_SUCCESS) {
      printf("FAIL: rank %d: step %d: %s\n", rank, step, mtxcomm_get_last_error(comm));
      return 1;
    }
  }
  const int last = rank == size - 1;
  if (!(stop && last)) {
    mtxcomm_comm_set_call_label(comm, "step 6");
    const size_t count = !stop && last ? 255 : 256;
    const mtxcomm_result_t rc =
        mtxcomm_allreduce(buf, buf, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, NULL);
    printf("rank %d: sixth call %d\n", rank, (int)rc);
    fflush(stdout);
  }
  /* Every rank stays until every record is there (the last one's comes with the SIGUSR1 of a
   * failing peer), so that no rank's exit ends the job before the others have written. */
  int all = 0;
  for (int k = 0; k < 3000 && !all; ++k) {
    all = 1;
    for (int r = 0; r < size; ++r) {
      char path[4096];
      struct stat st;
      snprintf(path, sizeof(path), "%s/world.rank%d.json", argv[2], r);
      all = all && stat(path, &st) == 0;
    }
    if (!all) usleep(10000);
  }
  if (stop && last) printf("rank %d: record %s\n", rank, all ? "written" : "MISSING");
  fflush(stdout);
  sleep(1); /* a peer that wrote its record on its own failure and on SIGUSR1 is done */
  mtxcomm_comm_abort(comm);
  return 0;
}
