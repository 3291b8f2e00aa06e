// The transport contract (tests/common/transport_contract.h) over the MPI transport: one process
// per rank under mpirun, every case whose rank count fits the job run on all of its ranks, each
// on a fresh transport over MPI_COMM_WORLD, the ranks kept in step by MPI_Barrier. A GoogleTest
// program: rank 0 prints the usual report, the other ranks print only their failures; the exit
// code (and with it mpirun's) is non-zero when any rank failed.
//
//   mpirun -np N mp_transport_contract [--gtest_filter=...]
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "common/transport_contract.h"
#include "transports/mpi/mpi_transport.h"

namespace mtxcomm {
namespace {

class MpiContractCase : public ::testing::Test {
 public:
  MpiContractCase(const contract::Case* c, contract::Traits traits)
      : case_(c), traits_(std::move(traits)) {}
  void TestBody() override {
    contract::Env e;
    MPI_Comm_rank(MPI_COMM_WORLD, &e.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &e.size);
    e.transport = makeMpiTransport(MPI_COMM_WORLD, 60);
    e.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
    e.traits = traits_;
    contract::runRank(e, *case_, nullptr);
  }

 private:
  const contract::Case* case_;
  contract::Traits traits_;
};

// On ranks other than 0: one line per failed assertion, naming the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                r.line_number(), r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::printf("[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
      std::fflush(stdout);
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace mtxcomm

int main(int argc, char** argv) {
  using namespace mtxcomm;  // NOLINT
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const contract::Traits traits = contract::mpiTraits(provided == MPI_THREAD_MULTIPLE);
  for (const contract::Case& c : contract::allCases()) {
    if (c.minRanks > size) continue;
    if (c.run == contract::viewsOnTwoThreads && !traits.threadSafeViews) {
      if (rank == 0) std::printf("%s: not run, MPI gives no MPI_THREAD_MULTIPLE\n", c.name);
      continue;
    }
    const std::string name = std::string(c.name) + "_np" + std::to_string(size);
    ::testing::RegisterTest(
        "MpiTransportContract", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
        [&c, traits]() -> ::testing::Test* { return new MpiContractCase(&c, traits); });
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
