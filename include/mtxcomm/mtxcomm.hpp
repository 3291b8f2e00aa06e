// Thin C++ wrapper over the C API: an RAII communicator and an exception that carries the
// result code and the detailed message. Header-only; links against libmtxcomm like C code.
#ifndef MTXCOMM_MTXCOMM_HPP_
#define MTXCOMM_MTXCOMM_HPP_

#include <stdexcept>
#include <string>
#include <utility>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {

// Thrown for every result other than MTXCOMM_SUCCESS.
class Error : public std::runtime_error {
 public:
  Error(mtxcomm_result_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  mtxcomm_result_t code() const noexcept { return code_; }

 private:
  mtxcomm_result_t code_;
};

namespace detail {
inline void check(mtxcomm_result_t r, mtxcomm_comm_t comm) {
  if (r != MTXCOMM_SUCCESS) {
    std::string msg = mtxcomm_get_last_error(comm);
    if (msg.empty()) msg = mtxcomm_get_error_string(r);
    throw Error(r, msg);
  }
}
}  // namespace detail

// Owns an mtxcomm_comm_t; destroys it when it goes out of scope. Movable, not copyable.
class Communicator {
 public:
  // The world communicator (mtxcomm_comm_init_from_env).
  static Communicator fromEnv() {
    mtxcomm_comm_t c = nullptr;
    detail::check(mtxcomm_comm_init_from_env(&c), nullptr);
    return Communicator(c);
  }
  // Takes ownership of a handle.
  explicit Communicator(mtxcomm_comm_t comm) noexcept : comm_(comm) {}
  Communicator(Communicator&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      mtxcomm_comm_destroy(comm_);
      comm_ = std::exchange(o.comm_, nullptr);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() { mtxcomm_comm_destroy(comm_); }

  mtxcomm_comm_t get() const noexcept { return comm_; }
  explicit operator bool() const noexcept { return comm_ != nullptr; }
  mtxcomm_comm_t release() noexcept { return std::exchange(comm_, nullptr); }

  int rank() const {
    int r = -1;
    detail::check(mtxcomm_comm_rank(comm_, &r), comm_);
    return r;
  }
  int size() const {
    int s = 0;
    detail::check(mtxcomm_comm_size(comm_, &s), comm_);
    return s;
  }
  // An empty Communicator when color is MTXCOMM_UNDEFINED.
  Communicator split(int color, int key) const {
    mtxcomm_comm_t c = nullptr;
    detail::check(mtxcomm_comm_split(comm_, color, key, &c), comm_);
    return Communicator(c);
  }
  void abort() noexcept { mtxcomm_comm_abort(std::exchange(comm_, nullptr)); }

  void allreduce(const void* send, void* recv, size_t count, mtxcomm_datatype_t dt,
                 mtxcomm_op_t op) const {
    detail::check(mtxcomm_allreduce(send, recv, count, dt, op, comm_, nullptr), comm_);
  }
  void broadcast(const void* send, void* recv, size_t count, mtxcomm_datatype_t dt,
                 int root) const {
    detail::check(mtxcomm_broadcast(send, recv, count, dt, root, comm_, nullptr), comm_);
  }
  void reduce(const void* send, void* recv, size_t count, mtxcomm_datatype_t dt, mtxcomm_op_t op,
              int root) const {
    detail::check(mtxcomm_reduce(send, recv, count, dt, op, root, comm_, nullptr), comm_);
  }
  void allgather(const void* send, void* recv, size_t sendcount, mtxcomm_datatype_t dt) const {
    detail::check(mtxcomm_allgather(send, recv, sendcount, dt, comm_, nullptr), comm_);
  }
  void reduceScatter(const void* send, void* recv, size_t recvcount, mtxcomm_datatype_t dt,
                     mtxcomm_op_t op) const {
    detail::check(mtxcomm_reduce_scatter(send, recv, recvcount, dt, op, comm_, nullptr), comm_);
  }
  void alltoall(const void* send, void* recv, size_t count, mtxcomm_datatype_t dt) const {
    detail::check(mtxcomm_alltoall(send, recv, count, dt, comm_, nullptr), comm_);
  }
  void alltoallv(const void* send, const size_t* sendcounts, const size_t* sdispls, void* recv,
                 const size_t* recvcounts, const size_t* rdispls, mtxcomm_datatype_t dt) const {
    detail::check(
        mtxcomm_alltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls, dt, comm_, nullptr),
        comm_);
  }
  void barrier() const { detail::check(mtxcomm_barrier(comm_), comm_); }

 private:
  mtxcomm_comm_t comm_ = nullptr;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_MTXCOMM_HPP_
