// `graph_fuzz`: the compiler's differential fuzzer on the command line (fuzz/graphs; the
// commands and what they found are in docs/reliability.md "Fuzzing the compiler").
//
//   graph_fuzz [--seed S] [--graphs N] [--batch K] [--out DIR] [--disable-pass NAME]...
//              [--threads 1,2] [--opsets 11,13,17] [--shrink-seconds T] [--shrink-max M]
//   graph_fuzz --one SEED --opset O [--out DIR]     one graph, as a run named it
//   graph_fuzz --replay DIR...                       reproducers (a directory of them, or one)
//   graph_fuzz --ranged SPAN [--ranged-axis A,B] [--seed S] [--graphs N] [--opsets ...]
//              [--out DIR]: each graph compiled once with a ranged entry over dims A, B of its
//              inputs (0, the batch, by default; SPAN values) and run at every value against
//              eager (differ.h RunRanged)
//
// Graph j of a run has seed S * 1000003 + j and the opset of its batch; batch b holds graphs
// [bK, (b+1)K) and is compiled into one cell. A difference (compiled refused, failed, or not
// HEALTHY under the strict gate) is shrunk by deleting nodes and saved under DIR as a
// reproducer; the exit status is 1 when any graph differed or was invalid.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/graphs/differ.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/ops/registry.h"

namespace kiln::graph_fuzz {
namespace {

struct Args {
  uint64_t seed = 1;
  int graphs = 200;
  int batch = 50;
  std::string out = "/tmp/kiln-graph-fuzz";
  std::vector<int64_t> opsets = FuzzOpsets();
  double shrink_seconds = 600;
  int shrink_max = 8;
  int64_t one = -1;
  int64_t one_opset = 17;
  std::vector<std::string> replay;
  int64_t ranged = 0;  // > 0: ranged mode over that many values
  std::vector<int64_t> ranged_axes = {0};
  DiffOptions diff;
};

std::vector<int64_t> IntList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(std::stoll(item));
  }
  return out;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "graph_fuzz: %s\nusage: graph_fuzz [--seed S] [--graphs N] [--batch K] [--out DIR]"
               " [--disable-pass NAME]... [--threads 1,2] [--opsets 11,13,17]"
               " [--shrink-seconds T] [--shrink-max M]\n       graph_fuzz --one SEED --opset O"
               " [--out DIR]\n       graph_fuzz --replay DIR...\n",
               why);
  return 2;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CollectOps(const onnx::GraphProto& g, std::set<std::string>& ops) {
  for (const auto& n : g.node()) {
    ops.insert(n.op_type());
    for (const auto& a : n.attribute()) {
      if (a.has_g()) CollectOps(a.g(), ops);
      for (const auto& sub : a.graphs()) CollectOps(sub, ops);
    }
  }
}

struct Found {
  FuzzGraph graph;
  CaseResult result;
};

// Shrinks (the first shrink_max) and saves each difference; returns how many were saved.
void Report(const std::vector<Found>& found, const Args& a) {
  int shrunk = 0;
  for (const Found& f : found) {
    const std::string dir = a.out + "/" + f.graph.name + "-" + OutcomeName(f.result.outcome);
    FuzzGraph small = f.graph;
    std::string how = "not shrunk (--shrink-max reached)";
    if (shrunk < a.shrink_max && IsDifference(f.result.outcome)) {
      ++shrunk;
      int rounds = 0;
      const auto start = std::chrono::steady_clock::now();
      small = Shrink(f.graph, a.diff, a.shrink_seconds, &rounds);
      std::ostringstream os;
      os << "shrunk from " << CountNodes(f.graph.model.graph()) << " to "
         << CountNodes(small.model.graph()) << " nodes in " << rounds << " rounds, "
         << static_cast<int>(Seconds(start)) << " s";
      how = os.str();
    }
    // What the shrunk graph gives now (it may differ in another way than the original).
    std::vector<CaseResult> now = RunBatch({small}, a.diff, nullptr);
    std::ostringstream note;
    note << OutcomeName(f.result.outcome) << ": " << f.result.note << "\nmoves:";
    for (const auto& m : f.graph.moves) note << " " << m;
    note << "\n"
         << how << "; the reproducer: " << OutcomeName(now[0].outcome) << ": " << now[0].note;
    if (!a.diff.disabled_passes.empty()) {
      note << "\ndisabled passes:";
      for (const auto& p : a.diff.disabled_passes) note << " " << p;
    }
    Status s = SaveCase(small, dir, note.str());
    if (s.ok()) s = SaveCase(f.graph, dir + "/original", note.str());
    std::printf("  %s %s\n    %s\n    %s -> %s\n", f.graph.name.c_str(),
                OutcomeName(f.result.outcome), f.result.note.substr(0, 400).c_str(), how.c_str(),
                s.ok() ? dir.c_str() : s.ToString().c_str());
    std::fflush(stdout);
  }
}

int Replay(const Args& a) {
  std::vector<std::string> dirs;
  for (const std::string& d : a.replay) {
    if (std::filesystem::exists(d + "/model.onnx")) {
      dirs.push_back(d);
      continue;
    }
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(d, ec)) {
      if (std::filesystem::exists(e.path() / "model.onnx")) dirs.push_back(e.path().string());
    }
    if (ec) {
      std::fprintf(stderr, "graph_fuzz: %s: %s\n", d.c_str(), ec.message().c_str());
      return 2;
    }
  }
  std::sort(dirs.begin(), dirs.end());
  // One cell per opset among the reproducers.
  std::map<int64_t, std::vector<FuzzGraph>> by_opset;
  std::map<int64_t, std::vector<std::string>> names;
  for (const std::string& d : dirs) {
    auto g = LoadCase(d);
    if (!g.ok()) {
      std::fprintf(stderr, "graph_fuzz: %s\n", g.status().ToString().c_str());
      return 2;
    }
    const int64_t opset = g->model.opset_import_size() ? g->model.opset_import(0).version() : 0;
    by_opset[opset].push_back(std::move(g).value());
    names[opset].push_back(d);
  }
  int bad = 0, total = 0;
  for (const auto& [opset, graphs] : by_opset) {
    std::vector<CaseResult> r = RunBatch(graphs, a.diff, nullptr);
    for (size_t i = 0; i < r.size(); ++i) {
      ++total;
      const bool ok = r[i].outcome == Outcome::kMatch;
      bad += !ok;
      std::printf("%-6s %s%s%s\n", ok ? "ok" : "FAIL", names.at(opset)[i].c_str(), ok ? "" : ": ",
                  ok ? "" : (std::string(OutcomeName(r[i].outcome)) + ": " + r[i].note).c_str());
    }
  }
  std::printf("replay: %d of %d reproducers match eager\n", total - bad, total);
  return bad == 0 && total > 0 ? 0 : 1;
}

std::string AxesText(const Args& a) {
  std::string s;
  for (int64_t ax : a.ranged_axes) s += (s.empty() ? "" : ",") + std::to_string(ax);
  return s;
}

// RunRanged in a child process, so a cell that corrupts memory or crashes (a wrong extent computed
// at run time writes out of bounds) is reported as that graph's failure instead of ending the
// run. The child sends its result and its counts through a pipe.
CaseResult RunRangedIsolated(const FuzzGraph& g, const Args& a, RangedStats* stats) {
  int fds[2];
  if (::pipe(fds) != 0) return {Outcome::kRunFailed, "pipe failed"};
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return {Outcome::kRunFailed, "fork failed"};
  if (pid == 0) {
    ::close(fds[0]);
    RangedStats mine;
    const CaseResult r = RunRanged(g, a.diff, a.ranged, a.ranged_axes, &mine);
    std::ostringstream os;
    os << static_cast<int>(r.outcome) << " " << mine.points << " " << mine.gaps << " "
       << mine.compiled << " " << mine.build_ms << " " << mine.run_ms << "\n"
       << r.note;
    const std::string out = os.str();
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;)
    text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ++stats->graphs;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.find('\n') == std::string::npos) {
    return {Outcome::kRunFailed,
            WIFSIGNALED(status)
                ? "the process running the cell died of signal " + std::to_string(WTERMSIG(status))
                : "the process running the cell exited without a result"};
  }
  std::istringstream head(text.substr(0, text.find('\n')));
  int outcome = 0, points = 0, gaps = 0, compiled = 0;
  double build_ms = 0, run_ms = 0;
  head >> outcome >> points >> gaps >> compiled >> build_ms >> run_ms;
  stats->points += points;
  stats->gaps += gaps;
  stats->compiled += compiled;
  stats->build_ms += build_ms;
  stats->run_ms += run_ms;
  return {static_cast<Outcome>(outcome), text.substr(text.find('\n') + 1)};
}

// Ranged mode: one cell per graph, each in a child process, no shrinking (the shrinker compares
// concrete cells); a difference is saved as the generated graph with the failing point in its
// README.
int RunRangedMode(const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  std::map<Outcome, int> counts;
  std::map<std::string, int> refusals;  // a gap's or refusal's first words, counted
  std::map<std::string, int> invalid;   // why a graph has no range, counted
  RangedStats stats;
  int bad = 0;
  for (int j = 0; j < a.graphs; ++j) {
    const int64_t opset = a.opsets[static_cast<size_t>(j) % a.opsets.size()];
    const uint64_t seed = a.seed * 1000003ULL + static_cast<uint64_t>(j);
    GenOptions o;
    o.opset = opset;
    FuzzGraph g = GenerateGraph(seed, o);
    g.name = "s" + std::to_string(seed) + "o" + std::to_string(opset);
    const CaseResult r = RunRangedIsolated(g, a, &stats);
    ++counts[r.outcome];
    if (r.outcome == Outcome::kInvalid) {
      ++invalid[r.note.substr(0, r.note.find_first_of("('"))];
    }
    if (r.outcome == Outcome::kCompileRefused) {
      // What broke, past "ranged entry {...}, piece {...}: ".
      const size_t entry = r.note.find("ranged entry {");
      const size_t cut = entry == std::string::npos ? std::string::npos : r.note.find("}: ", entry);
      ++refusals[r.note.substr(cut == std::string::npos ? 0 : cut + 3, 70)];
    }
    if (r.outcome == Outcome::kDiffers || r.outcome == Outcome::kRunFailed) {
      ++bad;
      const std::string dir = a.out + "/" + g.name + "-ranged-" + OutcomeName(r.outcome);
      std::ostringstream note;
      note << "ranged mode (--ranged " << a.ranged << " --ranged-axis " << AxesText(a)
           << ", those dims are n): " << OutcomeName(r.outcome) << ": " << r.note << "\nmoves:";
      for (const auto& m : g.moves) note << " " << m;
      Status s = SaveCase(g, dir, note.str());
      std::printf("  %s %s: %s\n    -> %s\n", g.name.c_str(), OutcomeName(r.outcome),
                  r.note.substr(0, 400).c_str(), s.ok() ? dir.c_str() : s.ToString().c_str());
      std::fflush(stdout);
    }
  }
  std::printf(
      "\n%d graphs in ranged mode (%lld values of dims %s each), %.0f s wall: "
      "%d compiled (%d points run, C++ builds %.0f s, runs %.1f s), %d with a gap\n",
      stats.graphs, static_cast<long long>(a.ranged), AxesText(a).c_str(), Seconds(start),
      stats.compiled, stats.points, stats.build_ms / 1000, stats.run_ms / 1000, stats.gaps);
  for (const auto& [o, n] : counts) std::printf("  %-16s %d\n", OutcomeName(o), n);
  std::printf("no range (invalid), by reason:\n");
  for (const auto& [why, n] : invalid) std::printf("  %3d  %s\n", n, why.c_str());
  std::printf("refusals and gaps, by their first words:\n");
  for (const auto& [why, n] : refusals) std::printf("  %3d  %s\n", n, why.c_str());
  std::fflush(stdout);
  return bad == 0 ? 0 : 1;
}

int Run(const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  std::map<Outcome, int> counts;
  std::map<std::string, int> moves;
  std::set<std::string> ops;
  std::vector<Found> found;
  BatchStats stats;
  int done = 0, batches = 0;
  auto run_batch = [&](std::vector<FuzzGraph> graphs, int64_t opset) {
    BatchStats bs;
    const auto bstart = std::chrono::steady_clock::now();
    std::vector<CaseResult> r = RunBatch(graphs, a.diff, &bs);
    int diffs = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      ++counts[r[i].outcome];
      for (const auto& m : graphs[i].moves) ++moves[m];
      CollectOps(graphs[i].model.graph(), ops);
      if (r[i].outcome != Outcome::kMatch) {
        ++diffs;
        found.push_back({graphs[i], r[i]});
        std::printf("  %s %s: %s\n", graphs[i].name.c_str(), OutcomeName(r[i].outcome),
                    r[i].note.substr(0, 300).c_str());
      }
    }
    std::printf(
        "batch %d: opset %lld, %zu graphs, %d nodes, %d cell%s: eager %.1f s, passes %.1f s, "
        "C++ build %.1f s, runs %.1f s, %.1f s in all; %d not matching\n",
        batches, static_cast<long long>(opset), graphs.size(), bs.nodes, bs.cells,
        bs.cells == 1 ? "" : "s", bs.eager_ms / 1000, bs.passes_ms / 1000, bs.build_ms / 1000,
        bs.run_ms / 1000, Seconds(bstart), diffs);
    std::fflush(stdout);
    stats.cells += bs.cells;
    stats.nodes += bs.nodes;
    stats.build_ms += bs.build_ms;
    done += static_cast<int>(graphs.size());
    ++batches;
  };
  if (a.one >= 0) {
    GenOptions o;
    o.opset = a.one_opset;
    FuzzGraph g = GenerateGraph(static_cast<uint64_t>(a.one), o);
    g.name = "s" + std::to_string(a.one) + "o" + std::to_string(a.one_opset);
    run_batch({g}, a.one_opset);
  } else {
    for (int b = 0; b * a.batch < a.graphs; ++b) {
      const int64_t opset = a.opsets[static_cast<size_t>(b) % a.opsets.size()];
      std::vector<FuzzGraph> graphs;
      for (int j = b * a.batch; j < std::min(a.graphs, (b + 1) * a.batch); ++j) {
        const uint64_t seed = a.seed * 1000003ULL + static_cast<uint64_t>(j);
        GenOptions o;
        o.opset = opset;
        FuzzGraph g = GenerateGraph(seed, o);
        g.name = "s" + std::to_string(seed) + "o" + std::to_string(opset);
        graphs.push_back(std::move(g));
      }
      run_batch(std::move(graphs), opset);
    }
  }
  const double wall = Seconds(start);
  std::printf("\n%d graphs in %d batches (%d cells, %d nodes), %.0f s wall (C++ builds %.0f s)\n",
              done, batches, stats.cells, stats.nodes, wall, stats.build_ms / 1000);
  for (const auto& [o, n] : counts) std::printf("  %-16s %d\n", OutcomeName(o), n);
  std::printf("moves:");
  for (const auto& [m, n] : moves) std::printf(" %s=%d", m.c_str(), n);
  const std::vector<std::string> all = OpRegistry::Global().OpTypes();
  std::vector<std::string> missing;
  for (const auto& op : all) {
    if (!ops.count(op)) missing.push_back(op);
  }
  std::printf("\nops: %zu of the %zu registered op types appeared; not generated:", ops.size(),
              all.size());
  for (const auto& op : missing) std::printf(" %s", op.c_str());
  std::printf("\n");
  std::fflush(stdout);
  if (!found.empty()) {
    std::printf("\n%zu graphs did not match; reproducers under %s:\n", found.size(), a.out.c_str());
    Report(found, a);
  }
  return found.empty() ? 0 : 1;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (arg == "--seed" && (v = next())) {
      a.seed = std::stoull(v);
    } else if (arg == "--graphs" && (v = next())) {
      a.graphs = std::stoi(v);
    } else if (arg == "--batch" && (v = next())) {
      a.batch = std::max(1, std::stoi(v));
    } else if (arg == "--out" && (v = next())) {
      a.out = v;
    } else if (arg == "--disable-pass" && (v = next())) {
      a.diff.disabled_passes.push_back(v);
    } else if (arg == "--threads" && (v = next())) {
      a.diff.threads.clear();
      for (int64_t t : IntList(v)) a.diff.threads.push_back(static_cast<int>(t));
    } else if (arg == "--opsets" && (v = next())) {
      a.opsets = IntList(v);
    } else if (arg == "--shrink-seconds" && (v = next())) {
      a.shrink_seconds = std::stod(v);
    } else if (arg == "--shrink-max" && (v = next())) {
      a.shrink_max = std::stoi(v);
    } else if (arg == "--one" && (v = next())) {
      a.one = std::stoll(v);
    } else if (arg == "--opset" && (v = next())) {
      a.one_opset = std::stoll(v);
    } else if (arg == "--ranged" && (v = next())) {
      a.ranged = std::stoll(v);
      if (a.ranged < 2 || a.ranged > 64) return Usage("--ranged takes a span in [2, 64]");
    } else if (arg == "--ranged-axis" && (v = next())) {
      a.ranged_axes = IntList(v);
      for (int64_t ax : a.ranged_axes) {
        if (ax < 0 || ax > 5) return Usage("--ranged-axis takes dims 0 to 5, comma-separated");
      }
      if (a.ranged_axes.empty()) return Usage("--ranged-axis takes at least one dim");
    } else if (arg == "--replay" && (v = next())) {
      a.replay.push_back(v);
    } else {
      return Usage(("unknown or incomplete argument '" + arg + "'").c_str());
    }
  }
  if (a.opsets.empty() || a.diff.threads.empty()) return Usage("empty --opsets or --threads");
  const std::vector<std::string>& passes = PassNames();
  for (const std::string& p : a.diff.disabled_passes) {
    if (std::find(passes.begin(), passes.end(), p) == passes.end()) {
      return Usage(("unknown pass '" + p + "'").c_str());
    }
  }
  if (!a.replay.empty()) return Replay(a);
  if (a.ranged > 0) return RunRangedMode(a);
  return Run(a);
}

}  // namespace
}  // namespace kiln::graph_fuzz

int main(int argc, char** argv) { return kiln::graph_fuzz::Main(argc, argv); }
