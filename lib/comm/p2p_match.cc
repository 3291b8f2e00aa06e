// The matching of the communicator's user receives (p2p.h, "Protocol"): messages to this rank
// itself, receives from any source, the inboxes' header receives (posted, parked, wanted) and
// which receive a header goes to. The progress thread's (or a caller's, under the progress
// lock); the rest of the channel: p2p.cc.
#include <cstring>
#include <utility>
#include <vector>

#include "lib/base/error.h"
#include "lib/comm/p2p.h"

namespace mtxcomm {

void P2p::startSelf(const P2pOpPtr& op) {
  if (op->isSend) {
    // The oldest receive of the tag that takes it: named for this rank, or from any source.
    auto named = selfRecvs_.find(op->tag);
    auto any = anyRecvs_.find(op->tag);
    P2pOpPtr recv;
    if (named != selfRecvs_.end() &&
        (any == anyRecvs_.end() || named->second.front()->seq < any->second.front()->seq)) {
      recv = std::move(named->second.front());
      named->second.pop_front();
      if (named->second.empty()) selfRecvs_.erase(named);
    } else if (any != anyRecvs_.end()) {
      recv = takeAny(op->tag);
      recv->source = rank_;
    }
    if (!recv) {
      const char* data = static_cast<const char*>(op->buf);
      selfMsgs_[op->tag].emplace_back(data, data + op->bytes);
    } else if (recv->bytes != op->bytes) {
      mismatch(*recv, op->bytes);
    } else {
      if (op->bytes) std::memcpy(recv->buf, op->buf, op->bytes);
      complete(*recv, MTXCOMM_SUCCESS, "");
    }
    complete(*op, MTXCOMM_SUCCESS, "");
    return;
  }
  auto it = selfMsgs_.find(op->tag);
  if (it == selfMsgs_.end()) {
    selfRecvs_[op->tag].push_back(op);
    return;
  }
  std::vector<char> msg = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) selfMsgs_.erase(it);
  op->source = rank_;
  if (msg.size() != op->bytes) {
    mismatch(*op, msg.size());
    return;
  }
  if (op->bytes) std::memcpy(op->buf, msg.data(), op->bytes);
  complete(*op, MTXCOMM_SUCCESS, "");
}

void P2p::startAny(const P2pOpPtr& op) {
  // A message already here is this receive's (no older receive of the tag waits, or it would
  // have taken it): this rank's own first, then the lowest peer's.
  if (selfMsgs_.count(op->tag)) {
    startSelf(op);  // takes the oldest; sets the source
    return;
  }
  const int n = view_->size();
  for (int peer = 0; peer < n; ++peer) {
    auto it = inboxes_.find(Key(peer, op->tag));
    if (it != inboxes_.end() && it->second.arrived) {
      deliver(it->first, op);
      return;
    }
  }
  anyRecvs_[op->tag].push_back(op);
  for (int peer = 0; peer < n; ++peer) {
    if (peer == rank_) continue;
    const Key key(peer, op->tag);
    postHeader(key, inboxes_[key]);
  }
}

void P2p::postHeader(const Key& key, Inbox& box) {
  if (box.arrived) return;
  if (box.parked) {
    // Wanted again: polled from now on (what arrived meanwhile is handled at the next poll).
    add(std::move(box.parked), nullptr, Part::kHeader, nullptr, key);
    return;
  }
  if (box.posted) return;
  box.posted = true;
  add(view_->irecv(key.first, key.second, box.header, P2pOp::kHeaderBytes), nullptr, Part::kHeader,
      nullptr, key);
}

bool P2p::wanted(const Key& key, const Inbox& box) const {
  return !box.recvs.empty() || anyRecvs_.count(key.second) != 0;
}

P2pOpPtr P2p::takeReceiver(const Key& key, Inbox& box) {
  auto any = anyRecvs_.find(key.second);
  if (!box.recvs.empty() &&
      (any == anyRecvs_.end() || box.recvs.front()->seq < any->second.front()->seq)) {
    P2pOpPtr recv = std::move(box.recvs.front());
    box.recvs.pop_front();
    return recv;
  }
  if (any == anyRecvs_.end()) return nullptr;
  return takeAny(key.second);  // deliver() sets its source
}

P2pOpPtr P2p::takeAny(int tag) {
  auto it = anyRecvs_.find(tag);
  P2pOpPtr recv = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) {
    anyRecvs_.erase(it);
    parkUnwanted(tag);
  }
  return recv;
}

void P2p::parkUnwanted(int tag) {
  compact([&](size_t i) {
    const Slot& s = slots_[i];
    if (s.part != Part::kHeader || s.key.second != tag) return false;
    Inbox& box = inboxes_[s.key];
    if (wanted(s.key, box)) return false;
    box.parked = std::move(reqs_[i]);
    return true;
  });
}

}  // namespace mtxcomm
