// Field tables of the Slippi frame events: X(name, C++ type, byte offset from the command byte),
// taken from project-slippi/slippi-wiki SPEC.md. Fields were appended by version, so a field is
// present in a file iff offset + sizeof(type) <= 1 + the payload size the file declares. The
// parser, the writer, the corpus and the dump all expand these tables, so each offset is written
// down exactly once.
#pragma once

// Pre-Frame Update (0x37). Frame number (0x1), player index (0x5) and is-follower (0x6) address
// the row and the column set, so they are not columns.
#define SLP_PRE_FRAME_FIELDS(X)              \
  X(random_seed, uint32_t, 0x07)             \
  X(action_state, uint16_t, 0x0B)            \
  X(x, float, 0x0D)                          \
  X(y, float, 0x11)                          \
  X(facing, float, 0x15)                     \
  X(joystick_x, float, 0x19)                 \
  X(joystick_y, float, 0x1D)                 \
  X(cstick_x, float, 0x21)                   \
  X(cstick_y, float, 0x25)                   \
  X(trigger, float, 0x29)                    \
  X(buttons, uint32_t, 0x2D)                 \
  X(buttons_physical, uint16_t, 0x31)        \
  X(trigger_physical_l, float, 0x33)         \
  X(trigger_physical_r, float, 0x37)         \
  X(raw_joystick_x, int8_t, 0x3B) /* 1.2 */  \
  X(percent, float, 0x3C)         /* 1.4 */  \
  X(raw_joystick_y, int8_t, 0x40) /* 3.15 */ \
  X(raw_cstick_x, int8_t, 0x41)   /* 3.17 */ \
  X(raw_cstick_y, int8_t, 0x42)   /* 3.17 */

// Post-Frame Update (0x38).
#define SLP_POST_FRAME_FIELDS(X)                \
  X(character, uint8_t, 0x07)                   \
  X(action_state, uint16_t, 0x08)               \
  X(x, float, 0x0A)                             \
  X(y, float, 0x0E)                             \
  X(facing, float, 0x12)                        \
  X(percent, float, 0x16)                       \
  X(shield, float, 0x1A)                        \
  X(last_attack_landed, uint8_t, 0x1E)          \
  X(combo_count, uint8_t, 0x1F)                 \
  X(last_hit_by, uint8_t, 0x20)                 \
  X(stocks, uint8_t, 0x21)                      \
  X(state_age, float, 0x22)       /* 0.2 */     \
  X(state_flags_1, uint8_t, 0x26) /* 2.0 */     \
  X(state_flags_2, uint8_t, 0x27)               \
  X(state_flags_3, uint8_t, 0x28)               \
  X(state_flags_4, uint8_t, 0x29)               \
  X(state_flags_5, uint8_t, 0x2A)               \
  X(misc_as, float, 0x2B)                       \
  X(airborne, uint8_t, 0x2F)                    \
  X(last_ground_id, uint16_t, 0x30)             \
  X(jumps_remaining, uint8_t, 0x32)             \
  X(l_cancel, uint8_t, 0x33)                    \
  X(hurtbox_state, uint8_t, 0x34)  /* 2.1 */    \
  X(self_air_x_speed, float, 0x35) /* 3.5 */    \
  X(self_y_speed, float, 0x39)                  \
  X(attack_x_speed, float, 0x3D)                \
  X(attack_y_speed, float, 0x41)                \
  X(self_ground_x_speed, float, 0x45)           \
  X(hitlag_remaining, float, 0x49)   /* 3.8 */  \
  X(animation_index, uint32_t, 0x4D) /* 3.11 */ \
  X(instance_hit_by, uint16_t, 0x51) /* 3.16 */ \
  X(instance_id, uint16_t, 0x53)

// Item Update (0x3B). The frame number (0x1) becomes the item's row index into the frame table.
#define SLP_ITEM_FIELDS(X)                 \
  X(type, uint16_t, 0x05)                  \
  X(state, uint8_t, 0x07)                  \
  X(facing, float, 0x08)                   \
  X(velocity_x, float, 0x0C)               \
  X(velocity_y, float, 0x10)               \
  X(x, float, 0x14)                        \
  X(y, float, 0x18)                        \
  X(damage, uint16_t, 0x1C)                \
  X(timer, float, 0x1E)                    \
  X(spawn_id, uint32_t, 0x22)              \
  X(misc_1, uint8_t, 0x26) /* 3.2 */       \
  X(misc_2, uint8_t, 0x27)                 \
  X(misc_3, uint8_t, 0x28)                 \
  X(misc_4, uint8_t, 0x29)                 \
  X(owner, int8_t, 0x2A)         /* 3.6 */ \
  X(instance_id, uint16_t, 0x2B) /* 3.16 */

// Frame Start (0x3A, 2.2).
#define SLP_FRAME_START_FIELDS(X) \
  X(random_seed, uint32_t, 0x05)  \
  X(scene_frame_counter, uint32_t, 0x09) /* 3.10 */

// Frame Bookend (0x3C, 3.0).
#define SLP_FRAME_BOOKEND_FIELDS(X) X(latest_finalized_frame, int32_t, 0x05) /* 3.7 */
