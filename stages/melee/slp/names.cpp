#include "stages/melee/slp/names.h"

#include <span>

namespace slipstream::slp {
namespace {

struct Character {
  int external;  // -1: none (Nana is never picked)
  int internal;  // -1: none (Ice Climbers are Popo + Nana in game)
  std::string_view name;
  std::string_view aliases;  // comma-separated short forms, lower case
};

// In external (character select) order; then Nana, who exists only in game.
constexpr Character kCharacters[] = {
    {0, 2, "Captain Falcon", "falcon,cf,c falcon"},
    {1, 3, "Donkey Kong", "dk"},
    {2, 1, "Fox", ""},
    {3, 24, "Mr. Game & Watch", "game & watch,game and watch,mr game and watch,gnw,g&w,gw"},
    {4, 4, "Kirby", ""},
    {5, 5, "Bowser", ""},
    {6, 6, "Link", ""},
    {7, 17, "Luigi", ""},
    {8, 0, "Mario", ""},
    {9, 18, "Marth", ""},
    {10, 16, "Mewtwo", "mew2,m2"},
    {11, 8, "Ness", ""},
    {12, 9, "Peach", ""},
    {13, 12, "Pikachu", "pika"},
    {14, -1, "Ice Climbers", "ics,icies,climbers"},
    {15, 15, "Jigglypuff", "puff,jiggs"},
    {16, 13, "Samus", ""},
    {17, 14, "Yoshi", ""},
    {18, 19, "Zelda", ""},
    {19, 7, "Sheik", ""},
    {20, 22, "Falco", ""},
    {21, 20, "Young Link", "ylink,yl,young link"},
    {22, 21, "Dr. Mario", "doc,doctor mario"},
    {23, 26, "Roy", ""},
    {24, 23, "Pichu", ""},
    {25, 25, "Ganondorf", "ganon"},
    {26, 27, "Master Hand", ""},
    {27, 29, "Wireframe (Male)", "male wireframe"},
    {28, 30, "Wireframe (Female)", "female wireframe"},
    {29, 31, "Giga Bowser", ""},
    {30, 28, "Crazy Hand", ""},
    {31, 32, "Sandbag", ""},
    {32, 10, "Popo", ""},
    {-1, 11, "Nana", ""},
};
// A player who picks the Ice Climbers plays as Popo; Nana follows.
constexpr int kIceClimbersExternal = 14, kPopoInternal = 10;

struct Stage {
  int id;
  std::string_view name;
  std::string_view aliases;
};

constexpr Stage kStages[] = {
    {2, "Fountain of Dreams", "fod,fountain"},
    {3, "Pokémon Stadium", "pokemon stadium,stadium,ps"},
    {4, "Princess Peach's Castle", "peach's castle"},
    {5, "Kongo Jungle", ""},
    {6, "Brinstar", ""},
    {7, "Corneria", ""},
    {8, "Yoshi's Story", "ys,story"},
    {9, "Onett", ""},
    {10, "Mute City", ""},
    {11, "Rainbow Cruise", ""},
    {12, "Jungle Japes", "japes"},
    {13, "Great Bay", ""},
    {14, "Hyrule Temple", "temple"},
    {15, "Brinstar Depths", "depths"},
    {16, "Yoshi's Island", ""},
    {17, "Green Greens", ""},
    {18, "Fourside", ""},
    {19, "Mushroom Kingdom I", "mushroom kingdom,mk1"},
    {20, "Mushroom Kingdom II", "mk2"},
    {22, "Venom", ""},
    {23, "Poké Floats", "poke floats"},
    {24, "Big Blue", ""},
    {25, "Icicle Mountain", ""},
    {26, "Icetop", ""},
    {27, "Flat Zone", ""},
    {28, "Dream Land N64", "dream land,dreamland,dl,dl64"},
    {29, "Yoshi's Island N64", ""},
    {30, "Kongo Jungle N64", ""},
    {31, "Battlefield", "bf"},
    {32, "Final Destination", "fd"},
    {33, "Target Test (Mario)", ""},
    {34, "Target Test (Captain Falcon)", ""},
    {35, "Target Test (Young Link)", ""},
    {36, "Target Test (Donkey Kong)", ""},
    {37, "Target Test (Dr. Mario)", ""},
    {38, "Target Test (Falco)", ""},
    {39, "Target Test (Fox)", ""},
    {40, "Target Test (Ice Climbers)", ""},
    {41, "Target Test (Kirby)", ""},
    {42, "Target Test (Bowser)", ""},
    {43, "Target Test (Link)", ""},
    {44, "Target Test (Luigi)", ""},
    {45, "Target Test (Marth)", ""},
    {46, "Target Test (Mewtwo)", ""},
    {47, "Target Test (Ness)", ""},
    {48, "Target Test (Peach)", ""},
    {49, "Target Test (Pichu)", ""},
    {50, "Target Test (Pikachu)", ""},
    {51, "Target Test (Jigglypuff)", ""},
    {52, "Target Test (Samus)", ""},
    {53, "Target Test (Sheik)", ""},
    {54, "Target Test (Yoshi)", ""},
    {55, "Target Test (Zelda)", ""},
    {56, "Target Test (Mr. Game & Watch)", ""},
    {57, "Target Test (Roy)", ""},
    {58, "Target Test (Ganondorf)", ""},
    {82, "Race to the Finish", ""},
    {83, "Grab the Trophies", ""},
    {84, "Home-Run Contest", "home run,hrc"},
    {85, "All-Star Lobby", ""},
};

// Lower-case letters and digits only, so case, spaces and punctuation never matter; the UTF-8
// é of "Pokémon" counts as e.
std::string normalize(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0xC3 && i + 1 < s.size() && (s[i + 1] == '\xA9' || s[i + 1] == '\x89')) {
      out += 'e';
      ++i;
    } else if (c >= 'A' && c <= 'Z') {
      out += static_cast<char>(c - 'A' + 'a');
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

template <class F>
void for_each_alias(std::string_view aliases, F&& f) {
  while (!aliases.empty()) {
    const size_t comma = aliases.find(',');
    f(aliases.substr(0, comma));
    if (comma == std::string_view::npos) break;
    aliases.remove_prefix(comma + 1);
  }
}

template <class Entry>
bool matches(const Entry& e, const std::string& key) {
  bool hit = normalize(e.name) == key;
  for_each_alias(e.aliases, [&](std::string_view a) { hit = hit || normalize(a) == key; });
  return hit;
}

// The one entry a spelling names; none when it names none, or (a table mistake the tests catch)
// more than one.
template <class Entry>
const Entry* find(std::span<const Entry> table, std::string_view name) {
  const std::string key = normalize(name);
  if (key.empty()) return nullptr;
  const Entry* found = nullptr;
  for (const Entry& e : table) {
    if (!matches(e, key)) continue;
    if (found) return nullptr;
    found = &e;
  }
  return found;
}

template <class Entry>
std::vector<std::string> spellings(std::span<const Entry> table) {
  std::vector<std::string> out;
  for (const Entry& e : table) {
    out.push_back(lower(e.name));
    for_each_alias(e.aliases, [&](std::string_view a) {
      if (!a.empty()) out.emplace_back(a);
    });
  }
  return out;
}

}  // namespace

std::optional<std::string_view> external_character_name(int id) {
  for (const Character& c : kCharacters)
    if (c.external >= 0 && c.external == id) return c.name;
  return std::nullopt;
}

std::optional<std::string_view> internal_character_name(int id) {
  for (const Character& c : kCharacters)
    if (c.internal >= 0 && c.internal == id) return c.name;
  return std::nullopt;
}

std::optional<std::string_view> stage_name(int id) {
  for (const Stage& s : kStages)
    if (s.id == id) return s.name;
  return std::nullopt;
}

std::optional<int> external_character_id(std::string_view name) {
  const Character* c = find<Character>(kCharacters, name);
  if (!c || c->external < 0) return std::nullopt;
  return c->external;
}

std::optional<int> internal_character_id(std::string_view name) {
  const Character* c = find<Character>(kCharacters, name);
  if (!c) return std::nullopt;
  if (c->external == kIceClimbersExternal) return kPopoInternal;
  if (c->internal < 0) return std::nullopt;
  return c->internal;
}

std::optional<int> stage_id(std::string_view name) {
  const Stage* s = find<Stage>(kStages, name);
  if (!s) return std::nullopt;
  return s->id;
}

std::vector<std::string> internal_character_names() {
  std::vector<std::string> out;
  for (int id = 0;; ++id) {
    const auto n = internal_character_name(id);
    if (!n) break;
    out.emplace_back(*n);
    if (id == kPopoInternal) out.emplace_back("Ice Climbers");  // accepted, and means Popo
  }
  return out;
}

std::vector<std::string> stage_names() {
  std::vector<std::string> out;
  for (const Stage& s : kStages) out.emplace_back(s.name);
  return out;
}

std::vector<std::string> character_spellings() {
  return spellings<Character>(kCharacters);
}

std::vector<std::string> stage_spellings() {
  return spellings<Stage>(kStages);
}

}  // namespace slipstream::slp
