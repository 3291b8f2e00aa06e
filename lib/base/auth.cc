#include "lib/base/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "lib/base/error.h"
#include "lib/base/socket_util.h"

namespace mtxcomm {

namespace {

bool allHex(const std::string& s) {
  if (s.empty() || s.size() % 2) return false;
  for (unsigned char c : s) {
    if (!std::isxdigit(c)) return false;
  }
  return true;
}

int hexValue(char c) {
  return c <= '9' ? c - '0' : (std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
}

}  // namespace

JobSecret JobSecret::random() {
  JobSecret s;
  s.bytes_.resize(32);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&s.bytes_[0]), 32) != 1) {
    fail(MTXCOMM_SYSTEM_ERROR, "the job secret: OpenSSL's RAND_bytes failed");
  }
  return s;
}

JobSecret JobSecret::fromText(const std::string& text, const char* origin) {
  JobSecret s;
  if (allHex(text) && text.size() >= 2 * kMinBytes) {
    for (size_t i = 0; i < text.size(); i += 2) {
      s.bytes_.push_back(static_cast<char>(hexValue(text[i]) * 16 + hexValue(text[i + 1])));
    }
    return s;
  }
  size_t meaningful = 0;  // whitespace does not count: "                " is no secret
  for (char c : text) meaningful += std::isspace(static_cast<unsigned char>(c)) ? 0 : 1;
  if (meaningful < kMinBytes) {
    fail(MTXCOMM_INVALID_USAGE, origin, ": the job secret must have at least ", kMinBytes,
         " bytes other than whitespace (32 hex digits, e.g. `openssl rand -hex 32`); it has ",
         meaningful);
  }
  s.bytes_ = text;
  return s;
}

JobSecret JobSecret::fromFile(const std::string& path, const char* origin) {
  // Symbolic links are followed (mounted secrets, e.g. Kubernetes', are links); what is checked
  // below is the file they lead to.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fail(MTXCOMM_INVALID_USAGE, origin, "=", path,
         ": cannot open the job secret file: ", std::strerror(errno));
  }
  struct stat st {};
  std::string text;
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if (st.st_uid != geteuid()) {
    why = "owned by another user (uid " + std::to_string(st.st_uid) + ")";
  } else if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    why = "readable or writable by other users (chmod 600 it)";
  } else if (st.st_size > 4096) {
    why = "larger than 4096 bytes";
  } else {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t r = ::read(fd, &text[got], text.size() - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    text.resize(got);
  }
  ::close(fd);
  if (!why.empty()) fail(MTXCOMM_INVALID_USAGE, origin, "=", path, ": ", why);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  return fromText(text, origin);
}

std::string JobSecret::hex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes_) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

Mac JobSecret::mac(std::string_view label, std::initializer_list<std::string_view> parts) const {
  if (empty()) fail(MTXCOMM_INTERNAL_ERROR, "a MAC without a job secret");
  std::string msg;
  auto add = [&msg](std::string_view p) {
    const uint32_t n = static_cast<uint32_t>(p.size());
    msg.append(reinterpret_cast<const char*>(&n), sizeof(n));
    msg.append(p.data(), p.size());
  };
  add(label);
  for (std::string_view p : parts) add(p);
  Mac out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len) ||
      len != out.size()) {
    fail(MTXCOMM_SYSTEM_ERROR, "OpenSSL's HMAC-SHA256 failed");
  }
  return out;
}

Nonce randomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    fail(MTXCOMM_SYSTEM_ERROR, "a handshake nonce: OpenSSL's RAND_bytes failed");
  }
  return n;
}

bool macEqual(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Mac connectorMac(const JobSecret& s, const AuthChallenge& c, const AuthResponse& r) {
  return s.mac("mtxcomm connector",
               {bytesOf(&c.channel, 4), bytesOf(c.nonce.data(), c.nonce.size()),
                bytesOf(r.nonce.data(), r.nonce.size()), bytesOf(r.claim, sizeof(r.claim))});
}

Mac acceptorMac(const JobSecret& s, const AuthChallenge& c, const AuthResponse& r) {
  return s.mac("mtxcomm acceptor",
               {bytesOf(&c.channel, 4), bytesOf(r.nonce.data(), r.nonce.size()),
                bytesOf(c.nonce.data(), c.nonce.size()), bytesOf(r.claim, sizeof(r.claim))});
}

AcceptorHandshake::AcceptorHandshake(int fd, const JobSecret& secret, AuthChannel channel,
                                     Clock::time_point deadline)
    : fd_(fd), secret_(secret), deadline_(deadline) {
  challenge_.magic = kAuthMagic;
  challenge_.channel = channel;
  challenge_.nonce = randomNonce();
}

bool AcceptorHandshake::writeSome(const void* p, size_t n, size_t* done) {
  while (*done < n) {
    const ssize_t w =
        ::send(fd_, static_cast<const char*>(p) + *done, n - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (w <= 0) {
      why_ = "the connection closed (" + errnoText(errno) + ")";
      return false;
    }
    *done += static_cast<size_t>(w);
  }
  return true;
}

AcceptorHandshake::State AcceptorHandshake::progress() {
  if (!why_.empty()) return State::kFailed;
  if (phase_ == 0) {
    if (!writeSome(&challenge_, sizeof(challenge_), &sent_)) {
      return why_.empty() ? State::kPending : State::kFailed;
    }
    phase_ = 1;
  }
  if (phase_ == 1) {
    auto* dst = reinterpret_cast<char*>(&response_);
    while (got_ < sizeof(response_)) {
      const ssize_t r = ::recv(fd_, dst + got_, sizeof(response_) - got_, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (r <= 0) {
        why_ = r == 0 ? "it closed the connection before answering the challenge"
                      : "the connection failed (" + errnoText(errno) + ")";
        return State::kFailed;
      }
      got_ += static_cast<size_t>(r);
      // Anything else than a handshake (an HTTP probe, another protocol) fails at once.
      if (got_ >= sizeof(uint64_t) && response_.magic != kAuthMagic) {
        why_ = "it did not answer the handshake (not an mtxcomm rank of this job)";
        return State::kFailed;
      }
    }
    if (got_ < sizeof(response_)) {
      if (Clock::now() >= deadline_) {
        why_ = "it did not answer the challenge within the handshake deadline";
        return State::kFailed;
      }
      return State::kPending;
    }
    if (response_.channel != challenge_.channel ||
        !macEqual(response_.mac, connectorMac(secret_, challenge_, response_))) {
      why_ = "it failed to prove the job secret (a stranger, or another job's rank)";
      return State::kFailed;
    }
    proof_.mac = acceptorMac(secret_, challenge_, response_);
    phase_ = 2;
  }
  if (phase_ == 2) {
    if (!writeSome(&proof_, sizeof(proof_), &proofSent_)) {
      return why_.empty() ? State::kPending : State::kFailed;
    }
    phase_ = 3;
  }
  return State::kDone;
}

short AcceptorHandshake::pollEvents() const { return phase_ == 1 ? POLLIN : POLLOUT; }

void connectorHandshake(int fd, const JobSecret& secret, AuthChannel channel,
                        const uint8_t (&claim)[32], Clock::time_point deadline,
                        const std::string& who, bool* refused) {
  if (refused) *refused = false;
  AuthChallenge c{};
  auto expect = [&](void* buf, size_t n, const char* what) {
    const IoResult r = recvAll(fd, buf, n, deadline);
    if (r == IoResult::kTimeout) {
      fail(MTXCOMM_TIMEOUT, who, ": no ", what, " within the bootstrap timeout");
    }
    if (r != IoResult::kOk) {
      fail(MTXCOMM_REMOTE_ERROR, who, ": the connection closed during the handshake (", what, ")");
    }
  };
  expect(&c, sizeof(c), "challenge");
  if (c.magic != kAuthMagic || c.channel != channel) {
    fail(MTXCOMM_INVALID_USAGE, who,
         ": the other end does not speak mtxcomm's handshake (not this job's rank or store)");
  }
  AuthResponse r{};
  r.magic = kAuthMagic;
  r.channel = channel;
  r.nonce = randomNonce();
  std::memcpy(r.claim, claim, sizeof(r.claim));
  r.mac = connectorMac(secret, c, r);
  if (!sendAll(fd, &r, sizeof(r))) {
    fail(MTXCOMM_REMOTE_ERROR, who, ": the connection closed during the handshake (",
         errnoText(errno), ")");
  }
  AuthProof p{};
  if (refused) *refused = true;  // a close from here on: the acceptor refused the response
  expect(&p, sizeof(p),
         "proof of the job secret (the other end refused this rank's: is "
         "MTXCOMM_JOB_SECRET the same on every rank?)");
  if (!macEqual(p.mac, acceptorMac(secret, c, r))) {
    fail(MTXCOMM_INVALID_USAGE, who,
         ": the other end failed to prove the job secret (a stranger on the port, or a job "
         "with another MTXCOMM_JOB_SECRET)");
  }
}

std::string peerAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
}

}  // namespace mtxcomm
