// HubServer: binds HubService to HTTP with cpp-httplib, and opens a hub's data dir (hub layer).
// This file is the one place a Reply becomes an HTTP response; no exception leaves a handler.
#include "src/kiln/hub/server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"

namespace kiln {

struct HubServer::Http {
  httplib::Server server;
};

namespace {

// Whether any range of a parsed Range header (first, last; -1 where absent, so (-1, n) is the
// suffix "-n") selects at least one byte of a `size`-byte representation.
bool AnyRangeSatisfiable(const httplib::Ranges& ranges, uint64_t size) {
  for (const auto& [first, last] : ranges) {
    if (first < 0) {
      if (last > 0 && size > 0) return true;  // a non-empty suffix of a non-empty blob
    } else if (static_cast<uint64_t>(first) < size) {
      return true;
    }
  }
  return false;
}

void Send(const Reply& r, httplib::Response& res) {
  res.status = r.status;
  if (!r.html.empty()) {
    res.set_content(r.html, "text/html; charset=utf-8");
  } else {
    res.set_content(r.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
  }
}

std::map<std::string, std::string> Query(const httplib::Request& req) {
  std::map<std::string, std::string> q;
  for (const auto& [k, v] : req.params) q[k] = v;
  return q;
}

}  // namespace

int DbPoolSize(const HubOptions& options) {
  const int threads = options.threads > 0 ? options.threads : 32;
  int pool = options.db_pool;
  if (pool <= 0) pool = std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  return std::clamp(pool, 1, threads);
}

HubServer::~HubServer() {
  Stop();
  if (verifier_.joinable()) verifier_.join();
}

void HubServer::VerifyBlobsOnSchedule() {
  const auto every = std::chrono::seconds(options_.blob_verify_interval_s);
  std::unique_lock<std::mutex> lock(verify_mu_);
  // The first pass runs at start, so damage done while the hub was down is found at once.
  for (bool first = true; first || !verify_cv_.wait_for(lock, every, [&] { return stopping_; });
       first = false) {
    if (stopping_) break;
    lock.unlock();
    const Reply r = service_->VerifyBlobs();
    if (!r.ok()) {
      KILN_LOG(ERROR) << "hub: scheduled blob verification failed: " << r.body.dump();
    } else if (const auto q = r.body.value("quarantined", nlohmann::json::array()); !q.empty()) {
      KILN_LOG(ERROR) << "hub: scheduled blob verification quarantined " << q.dump();
    }
    lock.lock();
  }
}

Result<std::unique_ptr<HubServer>> HubServer::Open(const HubOptions& options,
                                                   HubFirstStart* first_start) {
  if (options.data_dir.empty()) return Status::InvalidArgument("hub: --data DIR is required");
  KILN_RETURN_IF_ERROR(MakeDirs(options.data_dir));
  std::unique_ptr<HubStore> store;
  if (options.db_url.empty()) {
    KILN_ASSIGN_OR_RETURN(store, OpenSqliteStore(options.data_dir + "/hub.sqlite"));
  } else if (options.db_url.rfind("postgresql://", 0) == 0 ||
             options.db_url.rfind("postgres://", 0) == 0) {
    KILN_ASSIGN_OR_RETURN(store, OpenPostgresStore(options.db_url, DbPoolSize(options)));
  } else {
    return Status::InvalidArgument("hub: --db '" + options.db_url + "' is not a postgresql:// URL");
  }
  KILN_ASSIGN_OR_RETURN(auto blobs, OpenDiskBlobStore(options.data_dir + "/blobs"));
  KILN_ASSIGN_OR_RETURN(auto keys, SigningKeyRing::OpenOrCreate(options.data_dir));

  // Tokens: the file is the source of truth at start; a missing default file is created with a
  // fresh admin token that is shown once and never stored in clear.
  const std::string tokens_path =
      options.tokens_file.empty() ? options.data_dir + "/tokens.json" : options.tokens_file;
  if (!std::filesystem::exists(tokens_path)) {
    if (!options.tokens_file.empty()) {
      return Status::NotFound("hub: tokens file '" + tokens_path + "' does not exist");
    }
    KILN_ASSIGN_OR_RETURN(std::string admin, GenerateToken());
    TokenRow row{Sha256Hex(admin), "admin", "admin", "", ""};
    KILN_RETURN_IF_ERROR(WriteFileAtomic(tokens_path, TokensFileText({row})));
    if (first_start) {
      first_start->created_tokens_file = true;
      first_start->admin_token = admin;
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string tokens_text, ReadFile(tokens_path));
  KILN_ASSIGN_OR_RETURN(auto tokens, ParseTokensFile(tokens_text, tokens_path));

  HubServiceOptions service_options;
  if (options.rebuild == "verify") {
    service_options.builder = NewSandboxedBuilder(options.sandbox);
  } else if (options.rebuild != "off") {
    return Status::InvalidArgument("hub: --rebuild '" + options.rebuild +
                                   "' is not 'verify' or 'off'");
  }
  service_options.revocation_max_age_s = options.revocation_max_age_s;
  service_options.blob_grace_s = options.blob_grace_s;
  service_options.max_shared_object_bytes = options.max_shared_object_bytes;
  std::unique_ptr<HubServer> hub(new HubServer());
  hub->options_ = options;
  hub->service_ = std::make_unique<HubService>(std::move(store), std::move(blobs), std::move(keys),
                                               nullptr, std::move(service_options));
  // The file is the truth at every start: a token removed from it is dead, and a token an admin
  // revoked stays dead even while the file still lists it.
  KILN_ASSIGN_OR_RETURN(auto skipped, hub->service_->InstallTokens(tokens));
  for (const auto& name : skipped) {
    KILN_LOG(WARNING) << "hub: token '" << name << "' in " << tokens_path
                      << " was revoked by an admin and stays dead; remove it from the file";
  }
  hub->service_->set_ready_options(options.ready);
  hub->service_->StartMaintenance(options.gc_interval_s);
  hub->http_ = std::make_unique<Http>();
  hub->InstallRoutes();
  auto& svr = hub->http_->server;
  if (options.port == 0) {
    hub->port_ = svr.bind_to_any_port(options.bind);
    if (hub->port_ <= 0) {
      return Status::IOError("hub: cannot bind any port on " + options.bind);
    }
  } else {
    if (!svr.bind_to_port(options.bind, options.port)) {
      return Status::IOError("hub: cannot bind " + options.bind + ":" +
                             std::to_string(options.port) + " (in use?)");
    }
    hub->port_ = options.port;
  }
  if (options.blob_verify_interval_s > 0) {
    hub->verifier_ = std::thread([h = hub.get()] { h->VerifyBlobsOnSchedule(); });
  }
  KILN_LOG(INFO) << "hub: " << hub->service_->store().Describe() << ", blobs " << options.data_dir
                 << "/blobs, signing key " << hub->service_->keys().Current()->kid() << ", "
                 << tokens.size() << " token(s), listening on " << options.bind << ":"
                 << hub->port_;
  return hub;
}

Status HubServer::Serve() {
  if (!http_->server.listen_after_bind()) {
    return Status::IOError("hub: the listener on port " + std::to_string(port_) + " failed");
  }
  return Status::OK();
}

void HubServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(verify_mu_);
    stopping_ = true;
  }
  verify_cv_.notify_all();
  if (http_) http_->server.stop();
}

void HubServer::InstallRoutes() {
  auto& svr = http_->server;
  HubService* s = service_.get();
  const int threads = options_.threads > 0 ? options_.threads : 32;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Without TCP_NODELAY small JSON answers wait on delayed ACKs (~40 ms each).
  svr.set_tcp_nodelay(true);
  svr.set_keep_alive_max_count(100000);
  svr.set_keep_alive_timeout(30);
  svr.set_read_timeout(60);
  svr.set_write_timeout(60);
  svr.set_payload_max_length(options_.max_blob_bytes + 1);
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        KILN_LOG(ERROR) << "hub: " << req.method << " " << req.path << " threw: " << what;
        Send(Reply::Error(500, "internal", "the hub failed while handling " + req.path), res);
      });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      Send(Reply::Error(404, "not_found", "no route " + req.method + " " + req.path), res);
    } else if (res.status == 413) {
      Send(Reply::Error(413, "too_large", "request body exceeds the hub's limit"), res);
    }
  });

  // Runs `fn(principal)` after authentication; answers 401 otherwise.
  auto authed = [s](auto fn) {
    return [s, fn](const httplib::Request& req, httplib::Response& res) {
      auto who = s->Authenticate(req.get_header_value("Authorization"));
      if (auto* r = std::get_if<Reply>(&who)) return Send(*r, res);
      Send(fn(std::get<Principal>(who), req), res);
    };
  };

  svr.Get("/v1/health",
          [s](const httplib::Request&, httplib::Response& res) { Send(s->Health(), res); });
  svr.Get("/v1/ready",
          [s](const httplib::Request&, httplib::Response& res) { Send(s->Ready(), res); });
  svr.Get("/.well-known/jwks.json",
          [s](const httplib::Request&, httplib::Response& res) { Send(s->Jwks(), res); });
  svr.Get("/v1/revocations",
          [s](const httplib::Request&, httplib::Response& res) { Send(s->Revocations(), res); });
  svr.Get("/", [s](const httplib::Request&, httplib::Response& res) { Send(s->Dashboard(), res); });

  svr.Get(R"(/v1/cells/([^/]+))", authed([s](const Principal& p, const httplib::Request& req) {
            return s->ResolveCell(p, req.matches[1], req.get_param_value("family"));
          }));
  svr.Post("/v1/publish/intent", authed([s](const Principal& p, const httplib::Request& req) {
             return s->PublishIntent(p, req.body);
           }));
  svr.Post("/v1/publish/complete", authed([s](const Principal& p, const httplib::Request& req) {
             return s->PublishComplete(p, req.body);
           }));
  svr.Put(R"(/v1/blobs/([^/]+))", [s](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& content) {
    auto who = s->Authenticate(req.get_header_value("Authorization"));
    if (auto* r = std::get_if<Reply>(&who)) return Send(*r, res);
    BodyReader reader = [&](const std::function<bool(std::string_view)>& sink) {
      return content([&](const char* data, size_t len) { return sink({data, len}); });
    };
    Send(s->UploadBlob(std::get<Principal>(who), req.matches[1], reader), res);
  });
  svr.Get(R"(/v1/blobs/([^/]+))", [s](const httplib::Request& req, httplib::Response& res) {
    auto who = s->Authenticate(req.get_header_value("Authorization"));
    if (auto* r = std::get_if<Reply>(&who)) return Send(*r, res);
    auto opened = s->OpenBlob(std::get<Principal>(who), req.matches[1]);
    if (auto* r = std::get_if<Reply>(&opened)) return Send(*r, res);
    std::shared_ptr<BlobReader> reader = std::move(std::get<std::unique_ptr<BlobReader>>(opened));
    const uint64_t size = reader->size();
    // RFC 9110 §14.1.2: a range set none of whose ranges overlaps the blob is answered 416 with
    // the blob's length, never a 206 of a length computed past its end.
    if (!req.ranges.empty() && !AnyRangeSatisfiable(req.ranges, size)) {
      res.set_header("Content-Range", "bytes */" + std::to_string(size));
      return Send(Reply::Error(416, "range_not_satisfiable",
                               "no requested range starts inside the " + std::to_string(size) +
                                   "-byte blob " + std::string(req.matches[1])),
                  res);
    }
    res.set_header("Accept-Ranges", "bytes");
    // httplib answers a Range request (206 + Content-Range) from a sized content provider.
    res.set_content_provider(size, "application/octet-stream",
                             [reader](size_t offset, size_t length, httplib::DataSink& sink) {
                               char buf[64 * 1024];
                               const size_t want = std::min(length, sizeof(buf));
                               auto n = reader->ReadAt(offset, buf, want);
                               if (!n.ok() || *n == 0) return false;
                               return sink.write(buf, *n);
                             });
  });
  svr.Post(R"(/v1/blobs/([^/]+)/verify)",
           authed([s](const Principal& p, const httplib::Request& req) {
             return s->ReportBlobMismatch(p, req.matches[1]);
           }));
  svr.Get(R"(/v1/receipts/([^/]+)/([^/]+))",
          authed([s](const Principal& p, const httplib::Request& req) {
            return s->GetReceipt(p, req.matches[1], req.matches[2]);
          }));
  svr.Post("/v1/admin/revoke", authed([s](const Principal& p, const httplib::Request& req) {
             return s->Revoke(p, req.body);
           }));
  svr.Post("/v1/admin/tokens/revoke", authed([s](const Principal& p, const httplib::Request& req) {
             return s->RevokeToken(p, req.body);
           }));
  svr.Post("/v1/admin/rotate-key",
           authed([s](const Principal& p, const httplib::Request&) { return s->RotateKey(p); }));
  svr.Post("/v1/releases", authed([s](const Principal& p, const httplib::Request& req) {
             return s->CreateRelease(p, req.body);
           }));
  svr.Get(R"(/v1/releases/([^/]+)/obligations)",
          authed([s](const Principal& p, const httplib::Request& req) {
            return s->ReleaseObligations(p, req.matches[1]);
          }));
  svr.Post("/v1/obligations/settle", authed([s](const Principal& p, const httplib::Request& req) {
             return s->SettleObligation(p, req.body);
           }));
  svr.Post("/v1/events", authed([s](const Principal& p, const httplib::Request& req) {
             return s->PostEvents(p, req.body);
           }));
  svr.Get("/v1/events", authed([s](const Principal& p, const httplib::Request& req) {
            return s->QueryEvents(p, Query(req));
          }));
}

}  // namespace kiln
