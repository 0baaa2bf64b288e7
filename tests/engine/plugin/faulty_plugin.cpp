// Plugins an author got wrong, for the loader's refusals: built with FAULTY_TWICE, two classes
// register one kind; with FAULTY_OTHER_SDK, it says it was built against other headers (as the
// registration macro would under another SDK: its schema must not even be asked for); else a
// stage's schema() throws. None may end the process.
#include <stdexcept>

#include "engine/registry.h"

namespace {

class FaultyA : public slipstream::Stage {
 public:
  static slipstream::StageSchema schema() {
#if !defined(FAULTY_TWICE)
    throw std::runtime_error("a schema that cannot be built");
#endif
    return slipstream::StageSchema("plugin_faulty").family("plugin").doc("A (test plugin).");
  }
};
#ifdef FAULTY_OTHER_SDK
[[maybe_unused]] const bool registered = slipstream::StageRegistry::add_kind(
    &FaultyA::schema, []() -> slipstream::Stage* { return new FaultyA(); }, "0.0.0+other");
#else
SLIPSTREAM_REGISTER_STAGE(FaultyA);
#endif

#ifdef FAULTY_TWICE
class FaultyB : public slipstream::Stage {
 public:
  static slipstream::StageSchema schema() {
    return slipstream::StageSchema("plugin_faulty").family("plugin").doc("B (test plugin).");
  }
};
SLIPSTREAM_REGISTER_STAGE(FaultyB);
#endif

}  // namespace
