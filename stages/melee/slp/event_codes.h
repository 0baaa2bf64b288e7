// Command bytes and fixed offsets of the Slippi byte stream (slippi-wiki SPEC.md), shared by the
// parser and the writer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "stages/melee/slp/fields.h"

namespace slipstream::slp::event {

inline constexpr uint8_t kMessageSplitter = 0x10;
inline constexpr uint8_t kEventPayloads = 0x35;
inline constexpr uint8_t kGameStart = 0x36;
inline constexpr uint8_t kPreFrame = 0x37;
inline constexpr uint8_t kPostFrame = 0x38;
inline constexpr uint8_t kGameEnd = 0x39;
inline constexpr uint8_t kFrameStart = 0x3A;
inline constexpr uint8_t kItem = 0x3B;
inline constexpr uint8_t kFrameBookend = 0x3C;
inline constexpr uint8_t kGeckoList = 0x3D;

// Frame events carry the frame number at 0x1; Pre/Post carry player index and is-follower.
inline constexpr size_t kFrameNumberOffset = 0x01;
inline constexpr size_t kPlayerIndexOffset = 0x05;
inline constexpr size_t kIsFollowerOffset = 0x06;

// Message Splitter layout.
inline constexpr size_t kSplitterBlock = 0x01;
inline constexpr size_t kSplitterBlockSize = 512;
inline constexpr size_t kSplitterActualSize = 0x201;
inline constexpr size_t kSplitterInternalCommand = 0x203;
inline constexpr size_t kSplitterLastMessage = 0x204;
inline constexpr uint16_t kSplitterPayload = 0x204;

// Game End layout.
inline constexpr size_t kGameEndMethod = 0x01;
inline constexpr size_t kGameEndLras = 0x02;        // 2.0
inline constexpr size_t kGameEndPlacements = 0x03;  // 3.13, int8[4]

// Game Start layout (offsets from the command byte; the Game Info Block starts at 0x5).
namespace start {
inline constexpr size_t kVersion = 0x01;
inline constexpr size_t kBitfield = 0x05;  // 4 bytes
inline constexpr size_t kBombRain = 0x0B;
inline constexpr size_t kIsTeams = 0x0D;
inline constexpr size_t kItemSpawnBehavior = 0x10;
inline constexpr size_t kSelfDestructScore = 0x11;
inline constexpr size_t kStage = 0x13;
inline constexpr size_t kTimer = 0x15;
inline constexpr size_t kItemSpawnBitfield = 0x28;  // 5 bytes
inline constexpr size_t kDamageRatio = 0x35;
inline constexpr size_t kPlayerBlock = 0x65;  // + 0x24 * port
inline constexpr size_t kPlayerStride = 0x24;
// Within a player block.
inline constexpr size_t kCharacter = 0x00;
inline constexpr size_t kType = 0x01;
inline constexpr size_t kStocks = 0x02;
inline constexpr size_t kCostume = 0x03;
inline constexpr size_t kTeamShade = 0x07;
inline constexpr size_t kHandicap = 0x08;
inline constexpr size_t kTeam = 0x09;
inline constexpr size_t kPlayerBitfield = 0x0C;
inline constexpr size_t kCpuLevel = 0x0F;
inline constexpr size_t kDamageStart = 0x10;
inline constexpr size_t kDamageSpawn = 0x12;
inline constexpr size_t kOffenseRatio = 0x18;
inline constexpr size_t kDefenseRatio = 0x1C;
inline constexpr size_t kModelScale = 0x20;
// After the Game Info Block.
inline constexpr size_t kRandomSeed = 0x13D;
inline constexpr size_t kDashbackFix = 0x141;    // + 8 * port, 1.0
inline constexpr size_t kShieldDropFix = 0x145;  // + 8 * port, 1.0
inline constexpr size_t kNametag = 0x161;        // + 0x10 * port, 16 bytes, 1.3
inline constexpr size_t kNametagSize = 0x10;
inline constexpr size_t kIsPal = 0x1A1;       // 1.5
inline constexpr size_t kIsFrozenPs = 0x1A2;  // 2.0
inline constexpr size_t kMinorScene = 0x1A3;  // 3.7
inline constexpr size_t kMajorScene = 0x1A4;
inline constexpr size_t kDisplayName = 0x1A5;  // + 0x1F * port, 3.9
inline constexpr size_t kDisplayNameSize = 0x1F;
inline constexpr size_t kConnectCode = 0x221;  // + 0xA * port, 3.9
inline constexpr size_t kConnectCodeSize = 0x0A;
inline constexpr size_t kSlippiUid = 0x249;  // + 0x1D * port, 3.11
inline constexpr size_t kSlippiUidSize = 0x1D;
inline constexpr size_t kLanguage = 0x2BD;  // 3.12
inline constexpr size_t kMatchId = 0x2BE;   // 3.14, 51 bytes
inline constexpr size_t kMatchIdSize = 51;
inline constexpr size_t kGameNumber = 0x2F1;
inline constexpr size_t kTiebreakerNumber = 0x2F5;
inline constexpr uint16_t kPayloadSize_3_18 = 0x2F8;  // through the tiebreaker number
}  // namespace start

// Full (3.18) event sizes including the command byte, from the field tables.
#define SLP_FIELD_END(name, type, offset) size_t(offset + sizeof(type)),
inline constexpr size_t kPreFrameSize = std::max({SLP_PRE_FRAME_FIELDS(SLP_FIELD_END)});
inline constexpr size_t kPostFrameSize = std::max({SLP_POST_FRAME_FIELDS(SLP_FIELD_END)});
inline constexpr size_t kItemSize = std::max({SLP_ITEM_FIELDS(SLP_FIELD_END)});
inline constexpr size_t kFrameStartSize = std::max({SLP_FRAME_START_FIELDS(SLP_FIELD_END)});
inline constexpr size_t kFrameBookendSize = std::max({SLP_FRAME_BOOKEND_FIELDS(SLP_FIELD_END)});
#undef SLP_FIELD_END
inline constexpr size_t kGameEndSize = kGameEndPlacements + 4;

static_assert(kPreFrameSize == 0x43 && kPostFrameSize == 0x55 && kItemSize == 0x2D);

const char* name(uint8_t command);

}  // namespace slipstream::slp::event
