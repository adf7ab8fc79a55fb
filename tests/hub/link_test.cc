// The hub's library set links no kernel library and no OpenMP runtime (hub layer test). This
// binary links kiln_hub and nothing above the cell layer's compiler-free library (kiln_cell), so
// what is mapped into it is what a hub process maps: if kiln_hub ever links the interpreter, the
// loader or the compiler again, oneDNN and libgomp come with them and this test names them.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "src/kiln/hub/server.h"

namespace kiln {
namespace {

TEST(HubLinks, NoKernelLibraryOrOpenMpIsMapped) {
  // Reference the server so the linker keeps the hub's objects (and their dependencies).
  volatile auto open = &HubServer::Open;
  (void)open;
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps.good()) << "cannot read /proc/self/maps";
  std::string line, found;
  while (std::getline(maps, line)) {
    for (const char* lib : {"libdnnl", "libgomp", "libomp"}) {
      if (line.find(lib) != std::string::npos && found.find(lib) == std::string::npos) {
        found += line.substr(line.rfind(' ') + 1) + " ";
      }
    }
  }
  EXPECT_TRUE(found.empty()) << "the hub's library set maps " << found;
}

}  // namespace
}  // namespace kiln
