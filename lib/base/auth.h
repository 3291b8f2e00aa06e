// The job secret and the handshake every bootstrap connection passes (the TCP store, the TCP
// transport): "only the job gets in".
//
// Every job has a secret of at least 128 random bits, which never travels in the clear. A
// connection proves knowledge of it with a challenge-response over fresh nonces, in both
// directions (HMAC-SHA256 from OpenSSL, the comparison in constant time):
//   acceptor  -> connector   Challenge {magic, channel, nonceA}
//   connector -> acceptor    Response  {magic, channel, nonceC, claim, HMAC(secret, "c" | channel
//                                       | nonceA | nonceC | claim)}
//   acceptor  -> connector   Proof     {HMAC(secret, "a" | channel | nonceC | nonceA | claim)}
// The claim (who the connector says it is: its rank, the job size, the peer it wants) is bound
// into both MACs, so a stranger can neither join nor pass for a rank, a recorded exchange
// cannot be replayed (fresh nonces on both sides), and a connector never talks to an acceptor
// that does not hold the secret. What is not protected: the confidentiality and integrity of
// the traffic after the handshake (use a trusted network), other processes of the same user,
// and root (README, "Threat model").
//
// Where the secret comes from: MTXCOMM_JOB_SECRET (at least 32 hex digits, or 16 characters of
// any text), or MTXCOMM_JOB_SECRET_FILE (a regular file owned by this user, mode 0600 or
// stricter); `mtxrun` generates one for its ranks; a file: store makes one in its private job
// folder (lib/comm/file_store.cc).
#ifndef MTXCOMM_LIB_BASE_AUTH_H_
#define MTXCOMM_LIB_BASE_AUTH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lib/base/clock.h"

namespace mtxcomm {

using Nonce = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;

class JobSecret {
 public:
  static constexpr size_t kMinBytes = 16;
  JobSecret() = default;
  // 32 random bytes (OpenSSL's RAND_bytes). Throws MTXCOMM_SYSTEM_ERROR if it fails.
  static JobSecret random();
  // From a configured value: hex digits (at least 32) are decoded, any other text of at least
  // 16 bytes is used as it is. Throws MTXCOMM_INVALID_USAGE naming origin when too short.
  static JobSecret fromText(const std::string& text, const char* origin);
  // From a file (MTXCOMM_JOB_SECRET_FILE, a file: store's secret): a regular file owned by
  // this user and readable by nobody else. Throws MTXCOMM_INVALID_USAGE naming the file.
  static JobSecret fromFile(const std::string& path, const char* origin);
  bool empty() const { return bytes_.empty(); }
  // 64 hex digits, for files and the environment of the ranks mtxrun starts.
  std::string hex() const;
  // HMAC-SHA256(secret, label | part0 | part1 | ...), each part length-prefixed.
  Mac mac(std::string_view label, std::initializer_list<std::string_view> parts) const;

 private:
  std::string bytes_;
};

// A fresh random nonce. Throws MTXCOMM_SYSTEM_ERROR if the random generator fails.
Nonce randomNonce();
// Constant-time comparison (CRYPTO_memcmp).
bool macEqual(const Mac& a, const Mac& b);
inline std::string_view bytesOf(const void* p, size_t n) {
  return std::string_view(static_cast<const char*>(p), n);
}

// The wire messages of the handshake (fixed sizes, host byte order: every rank of a job runs
// the same build). claim is the connector's 32-byte claim, laid out by the channel.
struct AuthChallenge {
  uint64_t magic;
  uint32_t channel;
  uint32_t pad;
  Nonce nonce;
};
struct AuthResponse {
  uint64_t magic;
  uint32_t channel;
  uint32_t pad;
  Nonce nonce;
  uint8_t claim[32];
  Mac mac;
};
struct AuthProof {
  Mac mac;
};
constexpr uint64_t kAuthMagic = 0x316874616d747865ull;  // "extmauth1"-ish, never a TCP store op
enum AuthChannel : uint32_t { kAuthStore = 1, kAuthTransport = 2 };

// The MACs of the handshake (see the header comment).
Mac connectorMac(const JobSecret& s, const AuthChallenge& c, const AuthResponse& r);
Mac acceptorMac(const JobSecret& s, const AuthChallenge& c, const AuthResponse& r);

// The acceptor's side of the handshake on one accepted, non-blocking socket, driven by poll(2)
// beside any number of others: a silent or slow connection costs nothing but its own deadline
// (kHandshakeSeconds), and never delays the job's own connections.
class AcceptorHandshake {
 public:
  static constexpr double kHandshakeSeconds = 5.0;
  enum class State { kPending, kDone, kFailed };
  AcceptorHandshake(int fd, const JobSecret& secret, AuthChannel channel,
                    Clock::time_point deadline);
  int fd() const { return fd_; }
  // Reads and writes what the socket takes; kDone once the connector proved the secret (the
  // proof is sent), kFailed with why() when it did not, the connection closed or the deadline
  // passed.
  State progress();
  short pollEvents() const;
  Clock::time_point deadline() const { return deadline_; }
  const AuthResponse& response() const { return response_; }
  const std::string& why() const { return why_; }

 private:
  bool writeSome(const void* p, size_t n, size_t* done);
  int fd_;
  const JobSecret& secret_;
  Clock::time_point deadline_;
  AuthChallenge challenge_{};
  AuthResponse response_{};
  AuthProof proof_{};
  size_t sent_ = 0, got_ = 0, proofSent_ = 0;
  int phase_ = 0;  // 0 challenge, 1 response, 2 proof, 3 done
  std::string why_;
};

// The connector's side, blocking until deadline: reads the challenge, answers with claim, checks
// the acceptor's proof. Throws MTXCOMM_TIMEOUT or MTXCOMM_REMOTE_ERROR naming who, and
// MTXCOMM_INVALID_USAGE when the acceptor does not prove the secret (not this job: a stranger on
// the port, or a rank with another MTXCOMM_JOB_SECRET). refused, when given, tells whether a
// failure came after this side's response was sent (the acceptor closed instead of proving: it
// refused the proof, or dropped the connection under a flood).
void connectorHandshake(int fd, const JobSecret& secret, AuthChannel channel,
                        const uint8_t (&claim)[32], Clock::time_point deadline,
                        const std::string& who, bool* refused = nullptr);

// "1.2.3.4:5678" of the socket's peer, for log lines.
std::string peerAddress(int fd);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_AUTH_H_
