// HubMetrics and MetricsWriter (see metrics.h): the hub's Prometheus text.
#include "src/kiln/hub/metrics.h"

#include <cmath>
#include <cstdio>

namespace kiln {

namespace {

// A sample value: integers as integers (counters read exactly), others with full precision.
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.17g", v);
  }
  return buf;
}

// A bucket bound as its `le` label: the shortest text that reads back as the bound.
std::string Bound(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string MetricsWriter::EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void MetricsWriter::Family(const std::string& name, const char* type, const std::string& help) {
  out_ << "# HELP " << name << " " << EscapeHelp(help) << "\n# TYPE " << name << " " << type
       << "\n";
}

void MetricsWriter::Sample(const std::string& name, const MetricLabels& labels, double value) {
  out_ << name;
  if (!labels.empty()) {
    out_ << "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      out_ << (i ? "," : "") << labels[i].first << "=\"" << EscapeLabelValue(labels[i].second)
           << "\"";
    }
    out_ << "}";
  }
  out_ << " " << Number(value) << "\n";
}

void MetricsWriter::Histogram(const std::string& name, const MetricLabels& labels,
                              const std::vector<double>& bounds,
                              const std::vector<uint64_t>& counts, uint64_t count, double sum) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    MetricLabels l = labels;
    l.emplace_back("le", Bound(bounds[i]));
    Sample(name + "_bucket", l, static_cast<double>(cumulative));
  }
  MetricLabels inf = labels;
  inf.emplace_back("le", "+Inf");
  Sample(name + "_bucket", inf, static_cast<double>(count));
  Sample(name + "_sum", labels, sum);
  Sample(name + "_count", labels, static_cast<double>(count));
}

const std::vector<double>& HubMetrics::DurationBounds() {
  static const std::vector<double> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                              0.1,   0.25,   0.5,   1,    2.5,   5,
                                              10,    30,     60,    120,  300,   600};
  return kBounds;
}

void HubMetrics::ObserveRequest(const std::string& method, const std::string& pattern, int status,
                                double seconds) {
  const std::vector<double>& bounds = DurationBounds();
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{method, pattern, status}];
  Duration& d = durations_[{method, pattern}];
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (seconds <= bounds[i]) {
      ++d.counts[i];
      break;
    }
  }
  ++d.count;
  d.sum += seconds;
}

void HubMetrics::RegisterGauge(const std::string& name, const std::string& help, GaugeFunction fn) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_.push_back(Gauge{name, help, std::move(fn), "gauge"});
}

void HubMetrics::RegisterCounter(const std::string& name, const std::string& help,
                                 GaugeFunction fn) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_.push_back(Gauge{name, help, std::move(fn), "counter"});
}

void HubMetrics::Write(MetricsWriter* w) const {
  std::vector<Gauge> gauges;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w->Family("kiln_hub_requests_total", "counter",
              "Requests answered by a route handler, by method, route pattern and HTTP status.");
    for (const auto& [k, n] : requests_) {
      w->Sample("kiln_hub_requests_total",
                {{"method", std::get<0>(k)},
                 {"route", std::get<1>(k)},
                 {"code", std::to_string(std::get<2>(k))}},
                static_cast<double>(n));
    }
    w->Family("kiln_hub_request_duration_seconds", "histogram",
              "Time from a request reaching its handler to the handler's answer, by method and "
              "route pattern (a streamed download's transfer is not included).");
    for (const auto& [k, d] : durations_) {
      w->Histogram("kiln_hub_request_duration_seconds", {{"method", k.first}, {"route", k.second}},
                   DurationBounds(), d.counts, d.count, d.sum);
    }
    gauges = gauges_;
  }
  w->Family("kiln_hub_blob_bytes_uploaded_total", "counter",
            "Blob body bytes received by PUT /v1/blobs/{digest}.");
  w->Sample("kiln_hub_blob_bytes_uploaded_total", {},
            static_cast<double>(uploaded_.load(std::memory_order_relaxed)));
  w->Family("kiln_hub_blob_bytes_downloaded_total", "counter",
            "Blob bytes sent by GET /v1/blobs/{digest}.");
  w->Sample("kiln_hub_blob_bytes_downloaded_total", {},
            static_cast<double>(downloaded_.load(std::memory_order_relaxed)));
  // Gauges of one name written together, under one HELP/TYPE, in registration order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Gauge*>> by_name;
  for (const Gauge& g : gauges) {
    if (by_name[g.name].empty()) order.push_back(g.name);
    by_name[g.name].push_back(&g);
  }
  for (const std::string& name : order) {
    w->Family(name, by_name[name].front()->type, by_name[name].front()->help);
    for (const Gauge* g : by_name[name]) {
      for (const auto& [labels, value] : g->fn()) w->Sample(name, labels, value);
    }
  }
}

}  // namespace kiln
