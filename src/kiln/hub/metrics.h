// The hub's /metrics (hub layer): counters and gauges in the Prometheus text exposition format
// 0.0.4, read by a scraper holding an admin or a `metrics` token (docs/hub-api.md "Metrics").
//
// Two parts. MetricsWriter renders families (HELP and TYPE lines, then samples, label values
// escaped) and is the one place the format is written. HubMetrics holds what the hub counts
// itself: requests by route *pattern* (never the raw path, so a scraper's series stay bounded by
// the route table), their durations, and blob bytes moved. Gauges of other parts (the listener,
// the builder, the database pool, mint leases, ...) are registered as functions read at scrape
// time, so a new gauge is one RegisterGauge call where its numbers live.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kiln {

// Label name/value pairs of one sample, in the order written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Writes families in the text format: each family's "# HELP" and "# TYPE" lines once, then its
// samples. Names are the caller's constants ([a-zA-Z_:][a-zA-Z0-9_:]*); label values are escaped
// (backslash, double quote, newline) so any text is safe in them.
class MetricsWriter {
 public:
  // `type`: "counter" | "gauge" | "histogram". HELP text has backslash and newline escaped.
  void Family(const std::string& name, const char* type, const std::string& help);
  void Sample(const std::string& name, const MetricLabels& labels, double value);
  // A histogram's samples: one cumulative _bucket per upper bound (le), the +Inf bucket (= count),
  // _sum and _count. `counts[i]` is how many observations fell at or below bounds[i] and above
  // bounds[i-1] (not cumulative: this writes the running sums).
  void Histogram(const std::string& name, const MetricLabels& labels,
                 const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                 uint64_t count, double sum);
  std::string Text() const { return out_.str(); }

  // A label value as the format writes it between quotes.
  static std::string EscapeLabelValue(const std::string& v);

 private:
  std::ostringstream out_;
};

// A gauge read at scrape time: its samples now.
using GaugeFunction = std::function<std::vector<std::pair<MetricLabels, double>>()>;

class HubMetrics {
 public:
  // Upper bounds (seconds) of the request duration histogram.
  static const std::vector<double>& DurationBounds();

  // One answered request: `method` and the route's `pattern` ("/v1/blobs/{}"), its HTTP status
  // and how long its handler took.
  void ObserveRequest(const std::string& method, const std::string& pattern, int status,
                      double seconds);
  void AddBytesUploaded(uint64_t n) { uploaded_.fetch_add(n, std::memory_order_relaxed); }
  void AddBytesDownloaded(uint64_t n) { downloaded_.fetch_add(n, std::memory_order_relaxed); }

  // Adds a gauge family whose samples `fn` answers at each scrape (called on the scraping thread;
  // it must not block for long). Registering a name twice keeps both functions' samples under one
  // HELP/TYPE.
  void RegisterGauge(const std::string& name, const std::string& help, GaugeFunction fn);
  // The same for a counter kept elsewhere (monotonic since the process started): `fn` reads it.
  void RegisterCounter(const std::string& name, const std::string& help, GaugeFunction fn);

  // This object's families, then every registered gauge's.
  void Write(MetricsWriter* w) const;

 private:
  struct Duration {
    std::vector<uint64_t> counts = std::vector<uint64_t>(DurationBounds().size(), 0);
    uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, int>, uint64_t> requests_;  // method, pattern, code
  std::map<std::pair<std::string, std::string>, Duration> durations_;       // method, pattern
  struct Gauge {
    std::string name, help;
    GaugeFunction fn;
    const char* type = "gauge";  // or "counter"
  };
  std::vector<Gauge> gauges_;
  std::atomic<uint64_t> uploaded_{0};
  std::atomic<uint64_t> downloaded_{0};
};

}  // namespace kiln
