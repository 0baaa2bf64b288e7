#include "stages/melee/slp/game.h"

#include <algorithm>
#include <unordered_set>

#include "stages/melee/slp/event_codes.h"

namespace slipstream::slp {

std::string Version::str() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(build);
}

std::optional<Version> Version::parse(const std::string& text) {
  uint8_t parts[3] = {0, 0, 0};
  size_t i = 0;
  for (int part = 0; part < 3; ++part) {
    size_t digits = 0;
    unsigned v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 4) {
      v = v * 10 + static_cast<unsigned>(text[i++] - '0');
      ++digits;
    }
    if (digits == 0 || v > 255) return std::nullopt;
    parts[part] = static_cast<uint8_t>(v);
    if (i == text.size()) return Version{parts[0], parts[1], parts[2]};
    if (text[i++] != '.') return std::nullopt;
  }
  return std::nullopt;  // a fourth part, or a trailing '.'
}

namespace {

template <class Columns, class Views>
void view_columns(const Columns& cols, Views& views) {
  // Both instantiations visit fields in the same table order.
  std::vector<std::pair<const void*, size_t>> spans;
  Columns::visit(cols,
                 [&](FieldDesc, const auto& col) { spans.emplace_back(col.data(), col.size()); });
  size_t i = 0;
  Views::visit(views, [&](FieldDesc, auto& view) {
    using T = typename std::remove_cvref_t<decltype(view)>::element_type;
    view = View<std::remove_const_t<T>>(static_cast<const std::remove_const_t<T>*>(spans[i].first),
                                        spans[i].second);
    ++i;
  });
}

CharacterFramesT<View> view_character(const CharacterFrames& ch) {
  CharacterFramesT<View> v;
  v.present = ch.present;
  view_columns(ch.pre, v.pre);
  view_columns(ch.post, v.post);
  return v;
}

}  // namespace

GameView view_of(const Game& game) {
  GameView v;
  v.info = game.info;
  const Frames& f = game.frames;
  v.frames.frame = f.frame;
  view_columns(f.start, v.frames.start);
  view_columns(f.bookend, v.frames.bookend);
  for (const PortFrames& pf : f.ports) {
    PortFramesT<View> pv;
    pv.port = pf.port;
    pv.leader = view_character(pf.leader);
    if (pf.follower) pv.follower = view_character(*pf.follower);
    v.frames.ports.push_back(std::move(pv));
  }
  v.frames.items.row = f.items.row;
  view_columns(f.items.fields, v.frames.items.fields);
  return v;
}

std::vector<uint32_t> last_copy_rows(std::span<const int32_t> frames) {
  std::vector<uint32_t> keep;
  keep.reserve(frames.size());
  if (frames.empty()) return keep;
  const auto [lo, hi] = std::minmax_element(frames.begin(), frames.end());
  const int64_t range = int64_t(*hi) - int64_t(*lo) + 1;
  // Walk backwards: the first time a frame number is seen from the end is its last copy.
  if (range <= int64_t(frames.size()) * 4 + 1024) {
    std::vector<uint8_t> seen(static_cast<size_t>(range), 0);
    for (size_t i = frames.size(); i-- > 0;) {
      uint8_t& s = seen[static_cast<size_t>(int64_t(frames[i]) - *lo)];
      if (!s) {
        s = 1;
        keep.push_back(static_cast<uint32_t>(i));
      }
    }
  } else {
    std::unordered_set<int32_t> seen;
    for (size_t i = frames.size(); i-- > 0;)
      if (seen.insert(frames[i]).second) keep.push_back(static_cast<uint32_t>(i));
  }
  std::reverse(keep.begin(), keep.end());
  return keep;
}

FrameCounts count_frames(std::span<const int32_t> frames) {
  FrameCounts c;
  c.frames = frames.size();
  c.unique_frames = last_copy_rows(frames).size();
  c.rollback_frames = c.frames - c.unique_frames;
  return c;
}

namespace event {
const char* name(uint8_t command) {
  switch (command) {
    case kMessageSplitter:
      return "Message Splitter";
    case kEventPayloads:
      return "Event Payloads";
    case kGameStart:
      return "Game Start";
    case kPreFrame:
      return "Pre-Frame Update";
    case kPostFrame:
      return "Post-Frame Update";
    case kGameEnd:
      return "Game End";
    case kFrameStart:
      return "Frame Start";
    case kItem:
      return "Item Update";
    case kFrameBookend:
      return "Frame Bookend";
    case kGeckoList:
      return "Gecko List";
    default:
      return "event";
  }
}
}  // namespace event

}  // namespace slipstream::slp
