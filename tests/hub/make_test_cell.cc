// make_test_cell OUT.tar [NAME]: writes a valid (restating) test cell with a fake shared object,
// for benchmarks and manual hub runs (bench/hub_load.sh). The hub never dlopens, so the fake
// payload is enough; workers would refuse to arm it.
#include <cstdio>
#include <string>

#include "src/kiln/base/file.h"
#include "tests/hub/hub_fixtures.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_test_cell OUT.tar [NAME]\n");
    return 2;
  }
  const std::string name = argc > 2 ? argv[2] : "bench";
  const kiln::CellMetadata m = kiln::hub_testing::MakeMetadata(
      kiln::hub_testing::Graph(std::hash<std::string>{}(name) % 1000000));
  kiln::Status s = kiln::WriteFileAtomic(argv[1], kiln::hub_testing::MakeCell(m));
  if (!s.ok()) {
    std::fprintf(stderr, "make_test_cell: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", m.key.c_str());
  return 0;
}
