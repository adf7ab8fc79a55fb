// Tests of the hub's Prometheus text (src/kiln/hub/metrics.h): HELP and TYPE before every
// family's samples, label values escaped, histogram buckets cumulative and ending in +Inf equal
// to the count, requests counted by route pattern, registered gauges read at each scrape.
#include "src/kiln/hub/metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace kiln {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Sample lines ("name{labels} value") by their series text.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> out;
  for (const std::string& line : Lines(text)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return out;
}

TEST(MetricsWriter, FamiliesHaveHelpThenTypeThenSamplesAndLabelValuesAreEscaped) {
  MetricsWriter w;
  w.Family("kiln_test_things_total", "counter", "Things.\nSecond line \\ with a backslash.");
  w.Sample("kiln_test_things_total", {{"name", "a\"b\\c\nd"}, {"code", "200"}}, 3);
  w.Sample("kiln_test_things_total", {}, 0.25);
  const std::vector<std::string> lines = Lines(w.Text());
  ASSERT_EQ(lines.size(), 4u) << w.Text();
  EXPECT_EQ(lines[0], "# HELP kiln_test_things_total Things.\\nSecond line \\\\ with a backslash.");
  EXPECT_EQ(lines[1], "# TYPE kiln_test_things_total counter");
  EXPECT_EQ(lines[2], R"(kiln_test_things_total{name="a\"b\\c\nd",code="200"} 3)");
  EXPECT_EQ(lines[3], "kiln_test_things_total 0.25");
  EXPECT_EQ(MetricsWriter::EscapeLabelValue("plain/v1/{}"), "plain/v1/{}");
}

TEST(MetricsWriter, HistogramBucketsAreCumulativeAndEndInInfEqualToCount) {
  MetricsWriter w;
  w.Family("kiln_test_seconds", "histogram", "Durations.");
  // 1 at or below 0.1, 2 in (0.1, 1], 0 in (1, 10], 4 above 10.
  w.Histogram("kiln_test_seconds", {{"route", "/v1/x"}}, {0.1, 1, 10}, {1, 2, 0}, 7, 55.5);
  const auto s = Samples(w.Text());
  EXPECT_EQ(s.at(R"(kiln_test_seconds_bucket{route="/v1/x",le="0.1"})"), "1");
  EXPECT_EQ(s.at(R"(kiln_test_seconds_bucket{route="/v1/x",le="1"})"), "3");
  EXPECT_EQ(s.at(R"(kiln_test_seconds_bucket{route="/v1/x",le="10"})"), "3");
  EXPECT_EQ(s.at(R"(kiln_test_seconds_bucket{route="/v1/x",le="+Inf"})"), "7");
  EXPECT_EQ(s.at(R"(kiln_test_seconds_sum{route="/v1/x"})"), "55.5");
  EXPECT_EQ(s.at(R"(kiln_test_seconds_count{route="/v1/x"})"), "7");
}

TEST(HubMetrics, RequestsAreCountedByPatternAndTimedInOneHistogramPerRoute) {
  HubMetrics m;
  m.ObserveRequest("GET", "/v1/cells/{}", 200, 0.004);
  m.ObserveRequest("GET", "/v1/cells/{}", 200, 0.2);
  m.ObserveRequest("GET", "/v1/cells/{}", 404, 1000);  // past every bound: only +Inf
  m.ObserveRequest("PUT", "/v1/blobs/{}", 200, 0.001);
  m.AddBytesUploaded(100);
  m.AddBytesUploaded(23);
  m.AddBytesDownloaded(7);
  MetricsWriter w;
  m.Write(&w);
  const std::string text = w.Text();
  const auto s = Samples(text);
  EXPECT_EQ(s.at(R"(kiln_hub_requests_total{method="GET",route="/v1/cells/{}",code="200"})"), "2");
  EXPECT_EQ(s.at(R"(kiln_hub_requests_total{method="GET",route="/v1/cells/{}",code="404"})"), "1");
  EXPECT_EQ(s.at(R"(kiln_hub_requests_total{method="PUT",route="/v1/blobs/{}",code="200"})"), "1");
  EXPECT_EQ(s.at(R"(kiln_hub_blob_bytes_uploaded_total)"), "123");
  EXPECT_EQ(s.at(R"(kiln_hub_blob_bytes_downloaded_total)"), "7");
  const std::string get = R"(method="GET",route="/v1/cells/{}")";
  EXPECT_EQ(s.at("kiln_hub_request_duration_seconds_count{" + get + "}"), "3");
  EXPECT_EQ(s.at("kiln_hub_request_duration_seconds_bucket{" + get + ",le=\"0.005\"}"), "1");
  EXPECT_EQ(s.at("kiln_hub_request_duration_seconds_bucket{" + get + ",le=\"0.25\"}"), "2");
  EXPECT_EQ(s.at("kiln_hub_request_duration_seconds_bucket{" + get + ",le=\"600\"}"), "2");
  EXPECT_EQ(s.at("kiln_hub_request_duration_seconds_bucket{" + get + ",le=\"+Inf\"}"), "3");
  // Every bucket series never decreases along le, for every route.
  std::map<std::string, double> last;
  for (const std::string& line : Lines(text)) {
    if (line.rfind("kiln_hub_request_duration_seconds_bucket{", 0) != 0) continue;
    const std::string route = line.substr(0, line.find(",le="));
    const double v = std::stod(line.substr(line.rfind(' ') + 1));
    EXPECT_GE(v, last[route]) << line;
    last[route] = v;
  }
  // Each family's TYPE comes before its first sample.
  std::map<std::string, std::string> types;
  for (const std::string& line : Lines(text)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream f(line.substr(7));
      std::string name, type;
      f >> name >> type;
      EXPECT_EQ(types.count(name), 0u) << "TYPE twice: " << name;
      types[name] = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (types.count(name) == 0 && name.size() > sfx.size() &&
          name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        name = name.substr(0, name.size() - sfx.size());
      }
    }
    EXPECT_EQ(types.count(name), 1u) << "sample before its TYPE: " << line;
  }
}

TEST(HubMetrics, RegisteredGaugesAreReadAtEachScrapeUnderOneHeader) {
  HubMetrics m;
  int leases = 2;
  m.RegisterGauge("kiln_hub_test_leases", "Leases held.", [&leases] {
    return std::vector<std::pair<MetricLabels, double>>{{{{"state", "held"}}, double(leases)}};
  });
  m.RegisterGauge("kiln_hub_test_leases", "Leases held.", [] {
    return std::vector<std::pair<MetricLabels, double>>{{{{"state", "expired"}}, 1.0}};
  });
  MetricsWriter first;
  m.Write(&first);
  EXPECT_EQ(Samples(first.Text()).at(R"(kiln_hub_test_leases{state="held"})"), "2");
  EXPECT_EQ(Samples(first.Text()).at(R"(kiln_hub_test_leases{state="expired"})"), "1");
  size_t types = 0;
  for (const std::string& line : Lines(first.Text())) {
    types += line == "# TYPE kiln_hub_test_leases gauge" ? 1 : 0;
  }
  EXPECT_EQ(types, 1u);
  leases = 5;
  MetricsWriter second;
  m.Write(&second);
  EXPECT_EQ(Samples(second.Text()).at(R"(kiln_hub_test_leases{state="held"})"), "5");
}

}  // namespace
}  // namespace kiln
