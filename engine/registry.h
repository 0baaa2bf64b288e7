// The registry of stage kinds. Built-in stages register from static initialisers; plugins are
// shared objects that do the same when loaded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/schema.h"
// A plugin's registrations carry the fingerprint of the headers it was compiled with; code
// built into the program (SLIPSTREAM_IN_TREE) has none to compare.
#ifdef SLIPSTREAM_IN_TREE
#define SLIPSTREAM_REGISTRATION_ABI nullptr
#else
#include "engine/sdk_abi.h"
#define SLIPSTREAM_REGISTRATION_ABI SLIPSTREAM_SDK_ABI
#endif
#include "engine/stage.h"
#include "engine/state_io.h"

namespace slipstream {

class StageRegistry {
 public:
  // Registers a kind. A second registration of the same kind throws, except while a plugin
  // loads: there (a static initialiser, where an exception would end the process) it is noted,
  // and load_plugin throws it, naming the plugin and the kind; the kind registered first stays.
  static bool add(StageSchema schema);
  // What SLIPSTREAM_REGISTER_STAGE calls: add(make()) with the factory set, `sdk_abi` being the
  // SLIPSTREAM_SDK_ABI a plugin was compiled with (engine/sdk_abi.h; null: built into the
  // program). A plugin built against other headers is refused before make() runs (its classes'
  // layouts may differ from this slipstream's); a make() that throws while a plugin loads is
  // noted like a duplicate (load_plugin names the plugin and the error); elsewhere it throws.
  static bool add_kind(StageSchema (*make)(), Stage* (*factory)(), const char* sdk_abi);
  static const StageSchema* find(std::string_view kind);
  static std::vector<const StageSchema*> all();  // sorted by family, then kind
  static std::unique_ptr<Stage> create(std::string_view kind);
  // Loads a plugin .so (RTLD_NOW | RTLD_LOCAL); its static initialisers register its kinds.
  // Loading the same path twice is a no-op. Throws std::runtime_error with dlerror() text, or
  // naming the kinds the plugin registers that were registered before it.
  // `given`: the user named it for this command (`slipstream --plugin`): it stands in for a
  // graph's own plugins of the same kinds (a run's plugin rebuilt elsewhere).
  static void load_plugin(const std::string& path, bool given = false);
  // The plugin (its absolute path, as loaded) that registered `kind`; "" for the program's own.
  static std::string plugin_of(std::string_view kind);
  // Whether `kind` came from a plugin loaded as `given`.
  static bool kind_from_given_plugin(std::string_view kind);
};

}  // namespace slipstream

#define SLIPSTREAM_REGISTER_STAGE(Class)                                        \
  [[maybe_unused]] static const bool slipstream_stage_registered_##Class =      \
      ::slipstream::StageRegistry::add_kind(                                    \
          &Class::schema, []() -> ::slipstream::Stage* { return new Class(); }, \
          SLIPSTREAM_REGISTRATION_ABI)
