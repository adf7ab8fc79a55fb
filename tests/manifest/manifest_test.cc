// Tests for the worker manifest parser (src/kiln/manifest/manifest.h): the example manifests, every
// refusal by key path, defaults, path resolution and hub.token_env.
#include "src/kiln/manifest/manifest.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "src/kiln/base/file.h"
#include "src/kiln/graph/onnx_import.h"

namespace kiln {
namespace {

const std::string kSourceDir = KILN_SOURCE_DIR;

// A minimal valid manifest; bad cases below are this text with one thing broken.
constexpr const char* kMinimal = R"(
[endpoint]
name = "demo"

[targets.mlp]
graph = "model.onnx"
envelope = [{ x = [1, 64] }]

[functions.mlp]
target = "mlp"
)";

Result<Manifest> Parse(const std::string& text) {
  return ParseManifest(text, "kiln.toml", "/srv/models");
}

TEST(ManifestTest, MinimalManifestGetsTheDefaults) {
  Result<Manifest> m = Parse(kMinimal);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source, "kiln.toml");
  EXPECT_EQ(m->endpoint.name, "demo");
  EXPECT_EQ(m->endpoint.release, "");
  EXPECT_EQ(m->endpoint.port, 8080);
  EXPECT_EQ(m->endpoint.max_concurrency, 4);
  EXPECT_EQ(m->endpoint.threads, 0);
  EXPECT_EQ(m->endpoint.request_memory_mb, 0);
  EXPECT_FALSE(m->hub.has_value());
  Result<Manifest> budget =
      Parse(std::string(kMinimal).replace(std::string(kMinimal).find("name = \"demo\""), 13,
                                          "name = \"demo\"\nrequest_memory_mb = 2048"));
  ASSERT_TRUE(budget.ok()) << budget.status().ToString();
  EXPECT_EQ(budget->endpoint.request_memory_mb, 2048);
  ASSERT_EQ(m->targets.size(), 1u);
  const TargetSpec& t = m->targets[0];
  EXPECT_EQ(t.name, "mlp");
  EXPECT_EQ(t.graph, "/srv/models/model.onnx");
  EXPECT_EQ(t.checkpoint, "");
  EXPECT_EQ(t.lane, LanePolicy::kOptional);
  EXPECT_FALSE(t.exported());
  EXPECT_EQ(t.sm, "");
  EXPECT_DOUBLE_EQ(t.numerics.floor, 0.999);
  EXPECT_DOUBLE_EQ(t.numerics.warn, 0.99999);
  EXPECT_DOUBLE_EQ(t.numerics.retention, 0.999);
  EXPECT_EQ(m->mint.stall_window_s, 120);
  EXPECT_EQ(m->mint.memory_budget_mb, 0);
  EXPECT_EQ(m->mint.parallel_compiles, 2);
  EXPECT_EQ(m->function_to_target.at("mlp"), "mlp");
}

TEST(ManifestTest, FullManifestParsesEveryField) {
  ASSERT_EQ(::setenv("KILN_MANIFEST_TEST_TOKEN", "s3cret", 1), 0);
  Result<Manifest> m = Parse(R"(
[endpoint]
name = "studio"
release = "2024-06-r1"
port = 9000
max_concurrency = 8
threads = 16

[hub]
url = "https://hub.example:8443"
token_env = "KILN_MANIFEST_TEST_TOKEN"
trust = ["keys/jwks.json", "/etc/kiln/hub.pub"]
timeout_ms = 2500
revocation_poll_s = 10
revocation_max_age_s = 120
revocations_stale = "eager"
adopt_retry_max_s = 5

[targets.denoiser]
graph = "unet/model.onnx"
checkpoint = "unet/ft.safetensors"
lane = "mandatory"
export = { family = "acme/unet" }
sm = "x86-64-v3"
numerics = { floor = 0.99, warn = 0.999, retention = 0.98 }

[[targets.denoiser.envelope]]
latent = [1, 4, 64, 64]
timestep = [1]

[[targets.denoiser.envelope]]
latent = [2, 4, 64, 64]
timestep = [2]

[targets.decoder]
graph = "/abs/vae.onnx"
envelope = [{ z = [1, 4, 64, 64] }]

[functions.sd]
target = "denoiser"
aliases = ["stable", "sd-v1"]

[functions.vae]
target = "decoder"

[mint]
stall_window_s = 300
memory_budget_mb = 8192
parallel_compiles = 4
remints = 0
)");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->endpoint.release, "2024-06-r1");
  EXPECT_EQ(m->endpoint.port, 9000);
  EXPECT_EQ(m->endpoint.max_concurrency, 8);
  EXPECT_EQ(m->endpoint.threads, 16);
  ASSERT_TRUE(m->hub.has_value());
  EXPECT_EQ(m->hub->url, "https://hub.example:8443");
  EXPECT_EQ(m->hub->token, "s3cret");
  EXPECT_EQ(m->hub->token_env, "KILN_MANIFEST_TEST_TOKEN");
  EXPECT_EQ(m->hub->trust,
            (std::vector<std::string>{"/srv/models/keys/jwks.json", "/etc/kiln/hub.pub"}));
  EXPECT_EQ(m->hub->timeout_ms, 2500);
  EXPECT_EQ(m->hub->revocation_poll_s, 10);
  EXPECT_EQ(m->hub->revocation_max_age_s, 120);
  EXPECT_EQ(m->hub->revocations_stale, "eager");
  EXPECT_EQ(m->hub->adopt_retry_max_s, 5);
  EXPECT_EQ(m->mint.remints, 0);

  // Sorted by name, not declaration order.
  ASSERT_EQ(m->targets.size(), 2u);
  EXPECT_EQ(m->targets[0].name, "decoder");
  EXPECT_EQ(m->targets[1].name, "denoiser");
  const TargetSpec& d = m->targets[1];
  EXPECT_EQ(d.graph, "/srv/models/unet/model.onnx");
  EXPECT_EQ(d.checkpoint, "/srv/models/unet/ft.safetensors");
  EXPECT_EQ(d.lane, LanePolicy::kMandatory);
  ASSERT_TRUE(d.exported());
  EXPECT_EQ(d.export_spec->family, "acme/unet");
  EXPECT_EQ(d.sm, "x86-64-v3");
  EXPECT_DOUBLE_EQ(d.numerics.floor, 0.99);
  EXPECT_DOUBLE_EQ(d.numerics.warn, 0.999);
  EXPECT_DOUBLE_EQ(d.numerics.retention, 0.98);
  ASSERT_EQ(d.envelope.classes.size(), 2u);  // declaration order kept
  EXPECT_EQ(d.envelope.classes[0].at("latent"), (Shape{1, 4, 64, 64}));
  EXPECT_EQ(d.envelope.classes[1].at("timestep"), (Shape{2}));
  EXPECT_EQ(m->targets[0].graph, "/abs/vae.onnx");

  ASSERT_EQ(m->functions.size(), 2u);
  EXPECT_EQ(m->functions[0].name, "sd");
  EXPECT_EQ(m->functions[0].aliases, (std::vector<std::string>{"stable", "sd-v1"}));
  EXPECT_EQ(
      m->function_to_target,
      (std::map<std::string, std::string>{
          {"sd", "denoiser"}, {"stable", "denoiser"}, {"sd-v1", "denoiser"}, {"vae", "decoder"}}));
  EXPECT_EQ(m->mint.stall_window_s, 300);
  EXPECT_EQ(m->mint.memory_budget_mb, 8192);
  EXPECT_EQ(m->mint.parallel_compiles, 4);

  Result<const TargetSpec*> via_alias = m->FindTargetForFunction("sd-v1");
  ASSERT_TRUE(via_alias.ok()) << via_alias.status().ToString();
  EXPECT_EQ((*via_alias)->name, "denoiser");
  ::unsetenv("KILN_MANIFEST_TEST_TOKEN");
}

// Samples map every input to a .npy file, resolved against the manifest's directory like every
// path; several samples keep their order.
// Ranged entries beside classes: symbols with their ranges, fixed dims kept, declaration order
// (classes, then ranged entries) kept; samples may be given against a ranged-only envelope.
TEST(ManifestTest, RangedEntriesParseBesideClasses) {
  std::string text = kMinimal;
  text.replace(text.find("envelope = [{ x = [1, 64] }]"), 28,
               "envelope = [{ x = [1, 64] }, { x = [\"batch\", 64], ranges = { batch = [2, 32] } "
               "}]\nsamples = [{ x = \"s.npy\" }]");
  Result<Manifest> m = Parse(text);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Envelope& env = m->targets[0].envelope;
  ASSERT_EQ(env.classes.size(), 1u);
  ASSERT_EQ(env.ranged.size(), 1u);
  EXPECT_EQ(env.size(), 2u);
  EXPECT_EQ(DescribeRanged(env.ranged[0]), "{x=[batch,64] batch=[2,32]}");
  std::string stepped = kMinimal;
  stepped.replace(stepped.find("envelope = [{ x = [1, 64] }]"), 28,
                  "envelope = [{ x = [\"batch\", \"side\"], ranges = { batch = [1, 4], "
                  "side = [64, 256, 32] } }]\nsamples = [{ x = \"s.npy\" }]");
  Result<Manifest> st = Parse(stepped);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(DescribeRanged(st->targets[0].envelope.ranged[0]),
            "{x=[batch,side] batch=[1,4];side=[64,256,32]}");
  EXPECT_EQ(StepOf(st->targets[0].envelope.ranged[0], "side"), 32);
  EXPECT_EQ(StepOf(st->targets[0].envelope.ranged[0], "batch"), 1);
  EXPECT_EQ(m->targets[0].coverage, "");
  EXPECT_TRUE(m->targets[0].allows_partial_coverage());

  std::string only = kMinimal;
  only.replace(only.find("envelope = [{ x = [1, 64] }]"), 28,
               "envelope = [{ x = [\"b\", 64], ranges = { b = [1, 8] } }]\nlane = "
               "\"mandatory\"\nsamples = [{ x = \"s.npy\" }]");
  Result<Manifest> o = Parse(only);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->targets[0].envelope.classes.empty());
  EXPECT_FALSE(o->targets[0].allows_partial_coverage());
  std::string partial = only;
  partial.replace(partial.find("lane = "), 0, "coverage = \"partial\"\n");
  Result<Manifest> p = Parse(partial);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->targets[0].allows_partial_coverage());
  std::string bad = only;
  bad.replace(bad.find("lane = "), 0, "coverage = \"most\"\n");
  Result<Manifest> b = Parse(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(
                "targets.mlp.coverage is \"most\", expected \"full\" or \"partial\""),
            std::string::npos)
      << b.status().ToString();
}

TEST(ManifestTest, SamplesResolveAndKeepTheirOrder) {
  std::string text = kMinimal;
  const std::string envelope = "envelope = [{ x = [1, 64] }]";
  text.replace(text.find(envelope), envelope.size(),
               envelope + "\nsamples = [{ x = \"s/a.npy\" }, { x = \"/abs/b.npy\" }]");
  Result<Manifest> m = Parse(text);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const auto& samples = m->targets[0].samples;
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].at("x"), "/srv/models/s/a.npy");
  EXPECT_EQ(samples[1].at("x"), "/abs/b.npy");
  Result<Manifest> none = Parse(kMinimal);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->targets[0].samples.empty());
}

TEST(ManifestTest, HubCaAndInsecureHttp) {
  Result<Manifest> m = Parse(std::string(kMinimal) +
                             "[hub]\nurl = \"https://hub.internal:8443\"\nca = \"certs/ca.pem\"\n");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->hub->ca, "/srv/models/certs/ca.pem");
  EXPECT_FALSE(m->hub->insecure_http);
  Result<Manifest> plain = Parse(std::string(kMinimal) +
                                 "[hub]\nurl = \"http://10.0.0.5:8470\"\ninsecure_http = true\n");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(plain->hub->insecure_http);
  Result<Manifest> ca_on_http =
      Parse(std::string(kMinimal) + "[hub]\nurl = \"http://127.0.0.1:1\"\nca = \"ca.pem\"\n");
  ASSERT_FALSE(ca_on_http.ok());
  EXPECT_NE(ca_on_http.status().message().find("hub.ca is set but hub.url"), std::string::npos)
      << ca_on_http.status().message();
  Result<Manifest> not_bool =
      Parse(std::string(kMinimal) + "[hub]\nurl = \"http://127.0.0.1:1\"\ninsecure_http = 1\n");
  ASSERT_FALSE(not_bool.ok());
  EXPECT_NE(not_bool.status().message().find("hub.insecure_http"), std::string::npos)
      << not_bool.status().message();
}

TEST(ManifestTest, MandatoryTargetWithoutExportStillParses) {
  // The worker refuses it at boot (mandatory_lane_needs_a_cell); the parser keeps it.
  std::string text = kMinimal;
  text.replace(text.find("graph ="), 0, "lane = \"mandatory\"\n");
  Result<Manifest> m = Parse(text);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->targets[0].lane, LanePolicy::kMandatory);
  EXPECT_FALSE(m->targets[0].exported());
}

TEST(ManifestTest, FindTargetNamesTheKnownTargetsOnAMiss) {
  Result<Manifest> m = Parse(kMinimal);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(m->FindTarget("mlp").ok());
  Result<const TargetSpec*> miss = m->FindTarget("mpl");
  ASSERT_FALSE(miss.ok());
  EXPECT_EQ(miss.status().code(), StatusCode::kNotFound);
  EXPECT_NE(miss.status().message().find("\"mpl\""), std::string::npos) << miss.status().message();
  EXPECT_NE(miss.status().message().find("known targets: mlp"), std::string::npos)
      << miss.status().message();
  Result<const TargetSpec*> fn = m->FindTargetForFunction("nope");
  ASSERT_FALSE(fn.ok());
  EXPECT_NE(fn.status().message().find("known model names: mlp"), std::string::npos)
      << fn.status().message();
}

TEST(ManifestTest, TheDocumentedFullExampleParses) {
  Result<std::string> doc = ReadFile(kSourceDir + "/docs/manifest.md");
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  const size_t section = doc->find("## An annotated full example");
  ASSERT_NE(section, std::string::npos);
  const size_t begin = doc->find("```toml\n", section);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc->find("```", begin + 8);
  ASSERT_NE(end, std::string::npos);
  ASSERT_EQ(::setenv("KILN_HUB_TOKEN", "doc-token", 1), 0);
  Result<Manifest> m = Parse(doc->substr(begin + 8, end - begin - 8));
  ::unsetenv("KILN_HUB_TOKEN");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->targets.size(), 2u);
  EXPECT_FALSE(m->targets[0].exported());  // decoder: intake
  EXPECT_TRUE(m->targets[1].exported());   // denoiser
  EXPECT_EQ(m->targets[1].envelope.classes.size(), 2u);
  EXPECT_EQ(m->function_to_target.size(), 4u);
}

// Each bad manifest: `from` in kMinimal replaced by `to`, refused with every listed fragment.
struct BadCase {
  const char* label;
  const char* from;
  const char* to;
  std::vector<std::string> fragments;
};

TEST(ManifestTest, BadManifestsAreRefusedByKeyPath) {
  const std::vector<BadCase> cases = {
      {"typo envelop",
       "envelope =",
       "envelop =",
       {"kiln.toml:7:", "targets.mlp.envelop: unknown key", "did you mean \"envelope\"?"}},
      {"unknown top-level table",
       "[endpoint]",
       "[endpiont]",
       {"endpiont: unknown key", "at the top level", "did you mean \"endpoint\"?"}},
      {"unknown endpoint key",
       "name = \"demo\"",
       "name = \"demo\"\nprot = 80",
       {"endpoint.prot: unknown key", "did you mean \"port\"?"}},
      {"unknown function key",
       "target = \"mlp\"",
       "target = \"mlp\"\nalias = [\"a\"]",
       {"functions.mlp.alias: unknown key", "did you mean \"aliases\"?"}},
      {"graph wrong type",
       "graph = \"model.onnx\"",
       "graph = 42",
       {"targets.mlp.graph is an integer (42), expected a string"}},
      {"port wrong type",
       "name = \"demo\"",
       "name = \"demo\"\nport = \"80\"",
       {"endpoint.port is a string (\"80\"), expected an integer"}},
      {"port out of range",
       "name = \"demo\"",
       "name = \"demo\"\nport = 70000",
       {"endpoint.port is 70000, expected an integer port in 0..65535"}},
      {"missing graph",
       "graph = \"model.onnx\"\n",
       "",
       {"targets.mlp.graph is missing, expected a path"}},
      {"missing endpoint name", "name = \"demo\"", "", {"endpoint.name is missing"}},
      {"missing endpoint", "[endpoint]\nname = \"demo\"", "", {"endpoint is missing"}},
      {"no targets",
       "[targets.mlp]\ngraph = \"model.onnx\"\nenvelope = [{ x = [1, 64] }]",
       "",
       {"targets is missing, expected at least one [targets.<name>]"}},
      {"empty envelope",
       "envelope = [{ x = [1, 64] }]",
       "envelope = []",
       {"targets.mlp.envelope is empty, expected"}},
      {"missing envelope", "envelope = [{ x = [1, 64] }]", "", {"targets.mlp.envelope is missing"}},
      {"envelope not an array",
       "envelope = [{ x = [1, 64] }]",
       "envelope = { x = [1, 64] }",
       {"targets.mlp.envelope is a table, expected a non-empty array"}},
      {"negative dim",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }, { x = [2, -64] }]",
       {"targets.mlp.envelope[1].x[1] is -64, expected an integer dimension >= 0"}},
      // A class no request can carry: refused by key path before a mint sizes anything from it
      // (`kiln mint` used to segfault on it).
      {"2^62 dim",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }, { x = [4611686018427387904, 64] }]",
       {"targets.mlp.envelope[1].x is [4611686018427387904,64]", "more elements than int64 counts",
        "expected at most 4294967296 elements"}},
      {"dims past a request",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [67108864, 65] }]",
       {"targets.mlp.envelope[0].x is [67108864,65], 4362076160 elements",
        "expected at most 4294967296 elements"}},
      {"request_memory_mb negative",
       "name = \"demo\"",
       "name = \"demo\"\nrequest_memory_mb = -1",
       {"endpoint.request_memory_mb is -1, expected an integer >= 0 (megabytes; 0 = auto)"}},
      {"float dim",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64.0] }]",
       {"targets.mlp.envelope[0].x[1] is a float (64.0), expected an integer dimension"}},
      {"duplicate class",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }, { x = [4, 64] }, { x = [1, 64] }]",
       {"targets.mlp.envelope[2] repeats targets.mlp.envelope[0]"}},
      {"class names other inputs",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }, { y = [1, 64] }]",
       {"targets.mlp.envelope[1] names input \"y\"", "same graph inputs"}},
      {"empty class",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{}]",
       {"targets.mlp.envelope[0] names no input"}},
      {"symbol without ranges",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"batch\", 64] }]",
       {"targets.mlp.envelope[0].x[0] is a string (\"batch\")", "a symbol needs ranges"}},
      {"symbol with no range",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"batch\", 64], ranges = { seq = [1, 8] } }]",
       {"targets.mlp.envelope[0].x[0] is \"batch\"",
        "given a range in targets.mlp.envelope[0].ranges"}},
      {"range nothing uses",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [1, 8], seq = [1, 8] } }]",
       {"targets.mlp.envelope[0] gives a range for 'seq', which no input dim names"}},
      {"range upside down",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [8, 1] } }]",
       {"targets.mlp.envelope[0].ranges.b is [8, 1], expected an inclusive range [lo, hi]"}},
      {"step off the grid",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [64, 250, 32] } }]",
       {"targets.mlp.envelope[0].ranges.b range of 'b' is [64, 250, 32]",
        "250 is not on the step's grid from 64; expected hi = 224 or 256"}},
      {"step of one written out",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [1, 8, 1] } }]",
       {"step of 'b' is 1, expected an integer in [2, 2^30] (leave it out for 1)"}},
      {"range of four",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [1, 8, 2, 4] } }]",
       {"targets.mlp.envelope[0].ranges.b is an array", "or [lo, hi, step]"}},
      {"range not a pair",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = 8 } }]",
       {"targets.mlp.envelope[0].ranges.b is an integer (8), expected an inclusive range"}},
      {"ranged entry past a request",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 65], ranges = { b = [1, 67108864] } }]",
       {"targets.mlp.envelope[0].x at its ranges' upper bounds is [67108864,65]",
        "expected at most 4294967296 elements"}},
      {"class inside a range",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [1, 8] } }, { x = [4, 64] }]",
       {"targets.mlp.envelope[1] lies inside targets.mlp.envelope[0] {x=[b,64] b=[1,8]}",
        "expected no request to fit two entries"}},
      {"overlapping ranges",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [\"b\", 64], ranges = { b = [1, 8] } }, "
       "{ x = [\"n\", 64], ranges = { n = [8, 16] } }]",
       {"targets.mlp.envelope[1] {x=[n,64] n=[8,16]} may admit the requests "
        "targets.mlp.envelope[0] {x=[b,64] b=[1,8]} admits"}},
      {"unknown function target",
       "target = \"mlp\"",
       "target = \"mpl\"",
       {"functions.mlp.target is \"mpl\", which names no target", "did you mean \"mlp\"?",
        "(mlp)"}},
      {"alias collides with a model name",
       "target = \"mlp\"",
       "target = \"mlp\"\n[functions.other]\ntarget = \"mlp\"\naliases = [\"mlp\"]",
       {"functions.other.aliases[0] is \"mlp\", which is already the model name of "
        "functions.mlp"}},
      {"alias collides with an alias",
       "target = \"mlp\"",
       "target = \"mlp\"\naliases = [\"a\"]\n[functions.other]\ntarget = \"mlp\"\n"
       "aliases = [\"b\", \"a\"]",
       {"functions.other.aliases[1] is \"a\", which is already an alias in "
        "functions.mlp.aliases[0]"}},
      {"alias not a string",
       "target = \"mlp\"",
       "target = \"mlp\"\naliases = [1]",
       {"functions.mlp.aliases[0] is an integer (1), expected a string"}},
      {"lane sometimes",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nlane = \"sometimes\"",
       {"targets.mlp.lane is \"sometimes\", expected \"optional\" or \"mandatory\""}},
      {"floor above warn",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nnumerics = { floor = 0.9999, warn = 0.999 }",
       {"targets.mlp.numerics: floor 0.9999 is above warn 0.999",
        "expected 0 < floor <= warn <= 1"}},
      {"retention zero",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nnumerics = { retention = 0.0 }",
       {"targets.mlp.numerics.retention is 0.0, expected a number in (0, 1]"}},
      {"warn above one",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nnumerics = { warn = 1.5 }",
       {"targets.mlp.numerics.warn is 1.5"}},
      {"numerics nan",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nnumerics = { floor = nan }",
       {"targets.mlp.numerics.floor is nan"}},
      {"numerics typo",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nnumerics = { flor = 0.9 }",
       {"targets.mlp.numerics.flor: unknown key", "did you mean \"floor\"?"}},
      {"bad sm",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nsm = \"x86-64-v5\"",
       {"targets.mlp.sm is \"x86-64-v5\", expected one of x86-64, x86-64-v2, x86-64-v3, "
        "x86-64-v4"}},
      {"export without family",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nexport = {}",
       {"targets.mlp.export.family is missing"}},
      {"bad family",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nexport = { family = \"micro-diffusion\" }",
       {"targets.mlp.export.family is \"micro-diffusion\", expected a family \"<owner>/<name>\""}},
      {"export typo",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\nexport = { famliy = \"root/mlp\" }",
       {"targets.mlp.export.famliy: unknown key", "did you mean \"family\"?"}},
      {"bad target name",
       "[targets.mlp]",
       "[targets.\"m l p\"]",
       {"targets.\"m l p\": target name \"m l p\" is not a name"}},
      {"bad model name",
       "[functions.mlp]",
       "[functions.\"a/b\"]",
       {"functions.\"a/b\": model name \"a/b\" is not a name"}},
      {"empty checkpoint",
       "graph = \"model.onnx\"",
       "graph = \"model.onnx\"\ncheckpoint = \"\"",
       {"targets.mlp.checkpoint is empty, expected a path"}},
      {"hub without url",
       "[functions.mlp]",
       "[hub]\ntimeout_ms = 10\n[functions.mlp]",
       {"hub.url is missing"}},
      {"hub url scheme",
       "[functions.mlp]",
       "[hub]\nurl = \"hub:8080\"\n[functions.mlp]",
       {"hub.url is \"hub:8080\", expected an http:// or https:// URL"}},
      {"hub token and token_env",
       "[functions.mlp]",
       "[hub]\nurl = \"http://h\"\ntoken = \"t\"\ntoken_env = \"T\"\n[functions.mlp]",
       {"hub.token and hub.token_env are both set"}},
      {"hub timeout zero",
       "[functions.mlp]",
       "[hub]\nurl = \"http://h\"\ntimeout_ms = 0\n[functions.mlp]",
       {"hub.timeout_ms is 0, expected an integer in 1..3600000"}},
      {"hub stale policy",
       "[functions.mlp]",
       "[hub]\nurl = \"http://h\"\nrevocations_stale = \"ignore\"\n[functions.mlp]",
       {"hub.revocations_stale is \"ignore\", expected \"keep\" or \"eager\""}},
      {"hub poll zero",
       "[functions.mlp]",
       "[hub]\nurl = \"http://h\"\nrevocation_poll_s = 0\n[functions.mlp]",
       {"hub.revocation_poll_s is 0, expected an integer in 1..3600 (seconds)"}},
      {"mint remints negative",
       "[functions.mlp]",
       "[mint]\nremints = -1\n[functions.mlp]",
       {"mint.remints is -1, expected an integer in 0..100"}},
      {"mint typo",
       "[functions.mlp]",
       "[mint]\nstall_window = 60\n[functions.mlp]",
       {"mint.stall_window: unknown key", "did you mean \"stall_window_s\"?"}},
      {"mint parallel zero",
       "[functions.mlp]",
       "[mint]\nparallel_compiles = 0\n[functions.mlp]",
       {"mint.parallel_compiles is 0, expected an integer in 1..1024"}},
      {"samples not an array",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }]\nsamples = \"x.npy\"",
       {"targets.mlp.samples is a string", "expected an array of samples"}},
      {"sample names an input the envelope does not",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }]\nsamples = [{ x = \"x.npy\", y = \"y.npy\" }]",
       {"targets.mlp.samples[0] names input \"y\"", "which the envelope does not"}},
      {"sample lacks an input",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }]\nsamples = [{}]",
       {"targets.mlp.samples[0] lacks input \"x\""}},
      {"sample path not a string",
       "envelope = [{ x = [1, 64] }]",
       "envelope = [{ x = [1, 64] }]\nsamples = [{ x = 3 }]",
       {"targets.mlp.samples[0].x is an integer (3), expected a string"}},
      {"toml syntax", "name = \"demo\"", "name = \"demo", {"kiln.toml:3:", "not valid TOML"}},
      {"duplicate key",
       "name = \"demo\"",
       "name = \"demo\"\nname = \"again\"",
       {"kiln.toml:4:", "not valid TOML"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.label);
    std::string text = kMinimal;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << "test bug: '" << c.from << "' not in the base manifest";
    text.replace(at, std::string(c.from).size(), c.to);
    Result<Manifest> m = Parse(text);
    ASSERT_FALSE(m.ok()) << "accepted:\n" << text;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    const Status status = m.status();  // status() returns a copy; keep it alive
    const std::string& msg = status.message();
    EXPECT_EQ(msg.rfind("kiln.toml:", 0), 0u) << msg;
    for (const std::string& f : c.fragments) {
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
    }
  }
}

TEST(ManifestTest, TokenEnvReadsTheEnvironmentAndRefusesAnUnsetVariable) {
  const std::string text = std::string(kMinimal) +
                           "\n[hub]\nurl = \"http://127.0.0.1:7070\"\n"
                           "token_env = \"KILN_MANIFEST_TEST_TOKEN2\"\n";
  ::unsetenv("KILN_MANIFEST_TEST_TOKEN2");
  Result<Manifest> unset = Parse(text);
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.status().message().find(
                "hub.token_env names \"KILN_MANIFEST_TEST_TOKEN2\", which is not set"),
            std::string::npos)
      << unset.status().message();

  ASSERT_EQ(::setenv("KILN_MANIFEST_TEST_TOKEN2", "", 1), 0);
  Result<Manifest> empty = Parse(text);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("which is empty"), std::string::npos)
      << empty.status().message();

  ASSERT_EQ(::setenv("KILN_MANIFEST_TEST_TOKEN2", "tok-123", 1), 0);
  Result<Manifest> set = Parse(text);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->hub->token, "tok-123");
  EXPECT_EQ(set->hub->token_env, "KILN_MANIFEST_TEST_TOKEN2");
  ::unsetenv("KILN_MANIFEST_TEST_TOKEN2");

  // A literal token is kept verbatim and token_env stays empty.
  Result<Manifest> literal =
      Parse(std::string(kMinimal) + "\n[hub]\nurl = \"https://h\"\ntoken = \"abc\"\n");
  ASSERT_TRUE(literal.ok()) << literal.status().ToString();
  EXPECT_EQ(literal->hub->token, "abc");
  EXPECT_EQ(literal->hub->token_env, "");
  EXPECT_EQ(literal->hub->timeout_ms, 5000);
  EXPECT_TRUE(literal->hub->trust.empty());
}

TEST(ManifestTest, RelativePathsResolveAgainstTheManifestDirectory) {
  std::string tmpl = testing::TempDir() + "kiln_manifest_test_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(MakeDirs(dir + "/conf").ok());
  const std::string text = R"(
[endpoint]
name = "demo"
[hub]
url = "http://h"
trust = ["../keys/hub.jwks"]
[targets.mlp]
graph = "../models/./mlp.onnx"
checkpoint = "ft.safetensors"
envelope = [{ x = [1, 64] }]
[targets.abs]
graph = "/opt/graphs/abs.onnx"
envelope = [{ x = [1, 64] }]
)";
  ASSERT_TRUE(WriteFileAtomic(dir + "/conf/kiln.toml", text).ok());
  Result<Manifest> m = LoadManifest(dir + "/conf/kiln.toml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::string base = std::filesystem::path(dir).lexically_normal().string();
  EXPECT_EQ(m->base_dir, base + "/conf");
  EXPECT_EQ(m->source, dir + "/conf/kiln.toml");
  Result<const TargetSpec*> mlp = m->FindTarget("mlp");
  ASSERT_TRUE(mlp.ok());
  EXPECT_EQ((*mlp)->graph, base + "/models/mlp.onnx");
  EXPECT_EQ((*mlp)->checkpoint, base + "/conf/ft.safetensors");
  EXPECT_EQ(m->hub->trust, std::vector<std::string>{base + "/keys/hub.jwks"});
  Result<const TargetSpec*> abs = m->FindTarget("abs");
  ASSERT_TRUE(abs.ok());
  EXPECT_EQ((*abs)->graph, "/opt/graphs/abs.onnx");
  EXPECT_TRUE(m->functions.empty());

  // A relative manifest path still yields absolute paths inside.
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir(dir.c_str()), 0);
  Result<Manifest> rel = LoadManifest("conf/kiln.toml");
  ASSERT_EQ(::chdir(cwd), 0);
  ASSERT_TRUE(rel.ok()) << rel.status().ToString();
  EXPECT_EQ(rel->targets[1].graph, base + "/models/mlp.onnx");

  // An empty base_dir leaves relative paths relative (to the working directory).
  Result<Manifest> bare = ParseManifest(kMinimal, "inline", "");
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ(bare->targets[0].graph, "model.onnx");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(ManifestTest, MissingFileIsRefusedNamingThePath) {
  Result<Manifest> m = LoadManifest("/nonexistent/kiln.toml");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("/nonexistent/kiln.toml"), std::string::npos)
      << m.status().message();
}

// The example manifests parse, point at real files, and their envelopes name each graph's real
// inputs with shapes that agree with the graph's declared dims.
struct ExampleCase {
  const char* dir;
  const char* target;
  const char* family;
  const char* model;
  const char* alias;
  size_t classes;
};

TEST(ManifestTest, ExampleManifestsParseAndMatchTheirGraphs) {
  const std::vector<ExampleCase> cases = {
      {"mlp", "mlp", "root/mlp", "mlp", "mlp-classifier", 3},
      {"micro-diffusion", "denoiser", "root/micro-diffusion", "micro-diffusion", "denoiser", 1},
      {"transformer", "encoder", "root/transformer", "transformer", "encoder", 1},
  };
  for (const ExampleCase& c : cases) {
    SCOPED_TRACE(c.dir);
    const std::string dir = kSourceDir + "/examples/" + c.dir;
    Result<Manifest> m = LoadManifest(dir + "/kiln.toml");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->targets.size(), 1u);
    const TargetSpec& t = m->targets[0];
    EXPECT_EQ(t.name, c.target);
    EXPECT_TRUE(std::filesystem::exists(t.graph)) << t.graph;
    EXPECT_TRUE(std::filesystem::exists(t.checkpoint)) << t.checkpoint;
    EXPECT_EQ(std::filesystem::path(t.graph).parent_path(),
              std::filesystem::path(dir).lexically_normal());
    EXPECT_EQ(t.lane, LanePolicy::kOptional);
    ASSERT_TRUE(t.exported());
    EXPECT_EQ(t.export_spec->family, c.family);
    EXPECT_EQ(m->function_to_target.at(c.model), c.target);
    EXPECT_EQ(m->function_to_target.at(c.alias), c.target);
    ASSERT_EQ(t.envelope.classes.size(), c.classes);

    Result<Graph> g = ImportOnnxFile(t.graph);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    for (const ShapeClass& cls : t.envelope.classes) {
      EXPECT_EQ(cls.size(), g->inputs.size());
      for (const ValueInfo& in : g->inputs) {
        SCOPED_TRACE(in.name);
        auto it = cls.find(in.name);
        ASSERT_NE(it, cls.end()) << "envelope class lacks graph input " << in.name;
        ASSERT_EQ(it->second.size(), in.dims.size());
        for (size_t d = 0; d < in.dims.size(); ++d) {
          if (in.dims[d].known()) {
            EXPECT_EQ(it->second[d], in.dims[d].value) << "dim " << d;
          }
        }
      }
    }
  }
  // The mlp's classes are the three batch sizes, in declaration order.
  Result<Manifest> mlp = LoadManifest(kSourceDir + "/examples/mlp/kiln.toml");
  ASSERT_TRUE(mlp.ok());
  EXPECT_EQ(mlp->targets[0].envelope.classes[2].at("x"), (Shape{16, 64}));
}

// The copies a worker's broker writes: the credential gone, the relay and its capability in its
// place for the serving process, nothing for the mint children; the rest as it was.
TEST(ManifestTest, ManifestWithHubTakesTheCredentialOut) {
  ::setenv("KILN_MANIFEST_TEST_BROKER", "tok-from-env", 1);
  for (const std::string credential :
       {"token = \"tok-literal\"", "token_env = \"KILN_MANIFEST_TEST_BROKER\""}) {
    const std::string text = std::string(kMinimal) + "[hub]\nurl = \"https://hub.internal\"\n" +
                             credential + "\nca = \"ca.pem\"\ntimeout_ms = 700\n";
    auto serving = ManifestWithHub(text, "kiln.toml", "http://127.0.0.1:9", "cap-1");
    ASSERT_TRUE(serving.ok()) << serving.status().ToString();
    EXPECT_EQ(serving->find("tok-"), std::string::npos) << *serving;
    EXPECT_EQ(serving->find("KILN_MANIFEST_TEST_BROKER"), std::string::npos) << *serving;
    auto m = Parse(*serving);
    ASSERT_TRUE(m.ok()) << m.status().ToString() << "\n" << *serving;
    EXPECT_EQ(m->hub->url, "http://127.0.0.1:9");
    EXPECT_EQ(m->hub->token, "cap-1");
    EXPECT_EQ(m->hub->ca, "");
    EXPECT_EQ(m->hub->timeout_ms, 700);
    EXPECT_EQ(m->targets.at(0).graph, "/srv/models/model.onnx");

    auto mint = ManifestWithHub(text, "kiln.toml", "", "");
    ASSERT_TRUE(mint.ok()) << mint.status().ToString();
    EXPECT_EQ(mint->find("token"), std::string::npos) << *mint;
    m = Parse(*mint);
    ASSERT_TRUE(m.ok()) << m.status().ToString() << "\n" << *mint;
    EXPECT_EQ(m->hub->url, "https://hub.internal");
    EXPECT_EQ(m->hub->token, "");
    EXPECT_EQ(m->hub->ca, "/srv/models/ca.pem");
  }
  ::unsetenv("KILN_MANIFEST_TEST_BROKER");
  EXPECT_FALSE(ManifestWithHub("[hub", "kiln.toml", "", "").ok());
}

}  // namespace
}  // namespace kiln
