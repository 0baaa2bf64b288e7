// Plugins an author got wrong, for the loader's refusals: built with FAULTY_TWICE, two classes
// register one kind; without it, a stage's schema() throws. Neither may end the process.
#include <stdexcept>

#include "engine/registry.h"

namespace {

class FaultyA : public slipstream::Stage {
 public:
  static slipstream::StageSchema schema() {
#ifndef FAULTY_TWICE
    throw std::runtime_error("a schema that cannot be built");
#endif
    return slipstream::StageSchema("plugin_faulty").family("plugin").doc("A (test plugin).");
  }
};
SLIPSTREAM_REGISTER_STAGE(FaultyA);

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
