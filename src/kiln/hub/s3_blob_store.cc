// BlobStore on S3 (hub layer): SigV4-signed requests over cpp-httplib, staging then server-side
// copy for verify-then-visible. See s3_blob_store.h for the layout and the contracts.
#include "src/kiln/hub/s3_blob_store.h"

#include <httplib.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"

namespace kiln {
namespace {

constexpr uint64_t kMinPartBytes = 5ull << 20;
// S3 copies at most 5 GiB in one CopyObject request.
constexpr uint64_t kMaxCopyBytes = 5ull << 30;
const char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) {
    // RAND_bytes fails only without an entropy source; fall back to something still unique
    // per process and call, which is all a staging name needs.
    static std::atomic<uint64_t> n{0};
    return std::to_string(::getpid()) + "x" + std::to_string(n.fetch_add(1)) + "x" +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return HexEncode(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
}

// The text of the first <tag>…</tag> in `xml`, entity-decoded, or nullopt.
std::optional<std::string> XmlText(const std::string& xml, const std::string& tag,
                                   size_t* from = nullptr) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t start = xml.find(open, from ? *from : 0);
  if (start == std::string::npos) return std::nullopt;
  const size_t end = xml.find(close, start + open.size());
  if (end == std::string::npos) return std::nullopt;
  if (from) *from = end + close.size();
  std::string raw = xml.substr(start + open.size(), end - start - open.size()), out;
  static const std::pair<const char*, char> kEntities[] = {
      {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
  for (size_t i = 0; i < raw.size();) {
    bool replaced = false;
    if (raw[i] == '&') {
      for (const auto& [entity, c] : kEntities) {
        if (raw.compare(i, std::strlen(entity), entity) == 0) {
          out += c;
          i += std::strlen(entity);
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += raw[i++];
  }
  return out;
}

// "2026-12-02T11:38:59.000Z" -> unix seconds, or -1.
int64_t ParseIsoTime(const std::string& s) {
  std::tm tm{};
  if (sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
             &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6) {
    return -1;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm));
}

struct S3Reply {
  int status = 0;
  std::string body;
  httplib::Headers headers;
  std::string Header(const std::string& name) const {
    for (const auto& [k, v] : headers) {
      if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
    }
    return "";
  }
};

using Query = std::vector<std::pair<std::string, std::string>>;
using Headers = std::vector<std::pair<std::string, std::string>>;

// One S3 endpoint and bucket. Every call opens its own connection, so any thread may call.
class S3Client {
 public:
  explicit S3Client(S3Location loc) : loc_(std::move(loc)) {
    const size_t scheme = loc_.endpoint.find("://");
    host_ = scheme == std::string::npos ? loc_.endpoint : loc_.endpoint.substr(scheme + 3);
    while (!host_.empty() && host_.back() == '/') host_.pop_back();
    while (!loc_.endpoint.empty() && loc_.endpoint.back() == '/') loc_.endpoint.pop_back();
  }
  const S3Location& location() const { return loc_; }

  // What a message calls the object: s3://bucket/key.
  std::string Name(const std::string& key) const { return "s3://" + loc_.bucket + "/" + key; }

  // Sends one signed request. `key` "" addresses the bucket. A GET with `sink` streams a 2xx
  // body into it instead of S3Reply::body. Transport failures are s3_unreachable; every HTTP
  // answer, whatever its status, comes back as a reply.
  Result<S3Reply> Send(const std::string& method, const std::string& key, const Query& query,
                       Headers headers, std::string_view body,
                       const std::function<bool(const char*, size_t)>& sink = nullptr) const {
    const std::string path = "/" + SigV4UriEncode(loc_.bucket, false) +
                             (key.empty() ? "" : "/" + SigV4UriEncode(key, true));
    const std::string payload_sha = body.empty() ? kEmptySha256 : Sha256Hex(body);
    const std::string date = SigV4Now();
    headers.emplace_back("host", host_);
    headers.emplace_back("x-amz-date", date);
    headers.emplace_back("x-amz-content-sha256", payload_sha);
    if (!loc_.credentials.session_token.empty()) {
      headers.emplace_back("x-amz-security-token", loc_.credentials.session_token);
    }
    SigV4Request req{method, path, query, headers, payload_sha};
    const std::string authorization = SigV4Authorization(req, loc_.credentials, date);
    httplib::Headers h;
    for (const auto& [k, v] : headers) h.emplace(k == "host" ? "Host" : k, v);
    h.emplace("Authorization", authorization);
    const std::string canonical_query = SigV4CanonicalQuery(query);
    const std::string target = path + (canonical_query.empty() ? "" : "?" + canonical_query);

    httplib::Client http(loc_.endpoint);
    http.set_url_encode(false);
    http.set_connection_timeout(10, 0);
    http.set_read_timeout(120, 0);
    http.set_write_timeout(120, 0);
    S3Reply reply;
    httplib::Result res{nullptr, httplib::Error::Unknown};
    if (method == "GET" && sink) {
      res = http.Get(
          target, h,
          [&](const httplib::Response& r) {
            reply.status = r.status;
            return true;
          },
          [&](const char* data, size_t len) {
            if (reply.status / 100 == 2) return sink(data, len);
            reply.body.append(data, len);
            return true;
          });
    } else if (method == "GET") {
      res = http.Get(target, h);
    } else if (method == "HEAD") {
      res = http.Head(target, h);
    } else if (method == "DELETE") {
      res = http.Delete(target, h);
    } else if (method == "PUT") {
      res = http.Put(target, h, body.data(), body.size(), "application/octet-stream");
    } else if (method == "POST") {
      res = http.Post(target, h, body.data(), body.size(), "application/xml");
    } else {
      return Status::Internal("s3: unsupported method " + method);
    }
    if (!res) {
      return Status::Refused(StatusCode::kIOError, kRefusalS3Unreachable,
                             "s3 " + method + " " + Name(key) + " at " + loc_.endpoint + ": " +
                                 httplib::to_string(res.error()));
    }
    reply.status = res->status;
    if (!(method == "GET" && sink && reply.status / 100 == 2)) {
      if (reply.body.empty()) reply.body = res->body;
    }
    reply.headers = res->headers;
    return reply;
  }

  // The error for a reply whose status was not the one expected.
  Status Unexpected(const std::string& what, const std::string& key, const S3Reply& r,
                    const std::string& expected) const {
    const std::string code = XmlText(r.body, "Code").value_or("");
    const std::string detail = "s3 " + what + " " + Name(key) + ": HTTP " +
                               std::to_string(r.status) + (code.empty() ? "" : " " + code) +
                               ", expected " + expected;
    if (r.status == 403) {
      return Status::Refused(StatusCode::kIOError, kRefusalS3Denied,
                             detail + " (the store refused the key or the signature: check " +
                                 "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION)");
    }
    return Status::Refused(StatusCode::kIOError, kRefusalS3BadResponse, detail);
  }

 private:
  S3Location loc_;
  std::string host_;
};

// --- writer ---------------------------------------------------------------------------------

class S3Writer final : public BlobWriter {
 public:
  S3Writer(std::shared_ptr<const S3Client> s3, std::string digest, uint64_t expected,
           std::string staging, std::string final_key, std::atomic<int>* unstaged)
      : s3_(std::move(s3)),
        sink_(digest, expected),
        digest_(std::move(digest)),
        expected_(expected),
        staging_(std::move(staging)),
        final_(std::move(final_key)),
        unstaged_(unstaged) {
    unstaged_->fetch_add(1);
  }
  ~S3Writer() override {
    if (!committed_) {
      // Best effort: a leftover staging object or upload is invisible either way.
      if (!upload_id_.empty()) {
        (void)s3_->Send("DELETE", staging_, {{"uploadId", upload_id_}}, {}, {});
      } else if (staged_) {
        (void)s3_->Send("DELETE", staging_, {}, {}, {});
      }
    }
    MarkStaging();
  }

  Status Append(std::string_view bytes) override {
    KILN_RETURN_IF_ERROR(sink_.Count(bytes));
    buffer_.append(bytes);
    const uint64_t part = s3_->location().part_bytes;
    if (expected_ > part) {
      while (buffer_.size() >= part) {
        KILN_RETURN_IF_ERROR(UploadPart(std::string_view(buffer_).substr(0, part)));
        buffer_.erase(0, part);
      }
    }
    return Status::OK();
  }

  Status Commit() override {
    KILN_RETURN_IF_ERROR(sink_.Verify());
    const std::string hex = digest_.substr(7);
    if (upload_id_.empty() && expected_ <= s3_->location().part_bytes) {
      MarkStaging();
      KILN_ASSIGN_OR_RETURN(
          S3Reply r, s3_->Send("PUT", staging_, {}, {{"x-amz-meta-kiln-sha256", hex}}, buffer_));
      if (r.status != 200) return s3_->Unexpected("PUT", staging_, r, "200");
      staged_ = true;
    } else {
      if (!buffer_.empty()) KILN_RETURN_IF_ERROR(UploadPart(buffer_));
      KILN_RETURN_IF_ERROR(CompleteUpload());
    }
    buffer_.clear();
    buffer_.shrink_to_fit();

    // What the store holds under the staging key must be what was sent.
    KILN_ASSIGN_OR_RETURN(S3Reply head, s3_->Send("HEAD", staging_, {}, {}, {}));
    if (head.status != 200) return s3_->Unexpected("HEAD", staging_, head, "200");
    const std::string length = head.Header("Content-Length");
    if (length != std::to_string(expected_)) {
      sink_.refusal_ = "size_mismatch";
      return Status::Refused(StatusCode::kIOError, kRefusalS3BadResponse,
                             "s3 staged object " + s3_->Name(staging_) + " holds '" + length +
                                 "' bytes, sent " + std::to_string(expected_));
    }
    const std::string recorded = head.Header("x-amz-meta-kiln-sha256");
    if (recorded != hex) {
      sink_.refusal_ = "digest_mismatch";
      return Status::Refused(StatusCode::kIOError, kRefusalS3BadResponse,
                             "s3 staged object " + s3_->Name(staging_) + " records sha256 '" +
                                 recorded + "', sent " + hex);
    }

    // Visible only now, whole: a server-side copy is atomic for readers of the final key.
    KILN_ASSIGN_OR_RETURN(S3Reply copy,
                          s3_->Send("PUT", final_, {},
                                    {{"x-amz-copy-source", "/" + s3_->location().bucket + "/" +
                                                               SigV4UriEncode(staging_, true)}},
                                    {}));
    // S3 may answer 200 and still report an error in the body.
    if (copy.status != 200 || copy.body.find("<CopyObjectResult") == std::string::npos) {
      return s3_->Unexpected("copy to", final_, copy, "200 with CopyObjectResult");
    }
    committed_ = true;
    auto del = s3_->Send("DELETE", staging_, {}, {}, {});
    if (!del.ok() || (del->status != 204 && del->status != 200)) {
      KILN_LOG(WARNING) << "s3 blob store: could not delete staging object " << s3_->Name(staging_)
                        << " after publishing " << digest_;
    }
    return Status::OK();
  }
  const std::string& refusal() const override { return sink_.refusal_; }

 private:
  // From the first request on, the bucket's listing counts this upload (TempFileCount); before
  // it, the store's count of writers that have staged nothing yet does.
  void MarkStaging() {
    if (!marked_) unstaged_->fetch_sub(1);
    marked_ = true;
  }

  Status UploadPart(std::string_view bytes) {
    if (upload_id_.empty()) {
      MarkStaging();
      KILN_ASSIGN_OR_RETURN(S3Reply r,
                            s3_->Send("POST", staging_, {{"uploads", ""}},
                                      {{"x-amz-meta-kiln-sha256", digest_.substr(7)}}, {}));
      if (r.status != 200) return s3_->Unexpected("start multipart upload of", staging_, r, "200");
      auto id = XmlText(r.body, "UploadId");
      if (!id || id->empty()) {
        return Status::Refused(
            StatusCode::kIOError, kRefusalS3BadResponse,
            "s3 start multipart upload of " + s3_->Name(staging_) + ": the answer has no UploadId");
      }
      upload_id_ = *id;
    }
    const int number = static_cast<int>(etags_.size()) + 1;
    KILN_ASSIGN_OR_RETURN(
        S3Reply r,
        s3_->Send("PUT", staging_,
                  {{"partNumber", std::to_string(number)}, {"uploadId", upload_id_}}, {}, bytes));
    if (r.status != 200) {
      return s3_->Unexpected("upload part " + std::to_string(number) + " of", staging_, r, "200");
    }
    const std::string etag = r.Header("ETag");
    if (etag.empty()) {
      return Status::Refused(StatusCode::kIOError, kRefusalS3BadResponse,
                             "s3 upload part " + std::to_string(number) + " of " +
                                 s3_->Name(staging_) + ": the answer has no ETag");
    }
    etags_.push_back(etag);
    return Status::OK();
  }

  Status CompleteUpload() {
    std::string xml = "<CompleteMultipartUpload>";
    for (size_t i = 0; i < etags_.size(); ++i) {
      xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags_[i] +
             "</ETag></Part>";
    }
    xml += "</CompleteMultipartUpload>";
    KILN_ASSIGN_OR_RETURN(S3Reply r,
                          s3_->Send("POST", staging_, {{"uploadId", upload_id_}}, {}, xml));
    if (r.status != 200 || r.body.find("<CompleteMultipartUploadResult") == std::string::npos) {
      return s3_->Unexpected("complete multipart upload of", staging_, r,
                             "200 with CompleteMultipartUploadResult");
    }
    upload_id_.clear();
    staged_ = true;
    return Status::OK();
  }

  std::shared_ptr<const S3Client> s3_;
  VerifyingSink sink_;
  std::string digest_;
  uint64_t expected_;
  std::string staging_, final_;
  std::atomic<int>* unstaged_;
  bool marked_ = false;
  std::string buffer_;
  std::string upload_id_;
  std::vector<std::string> etags_;
  bool staged_ = false;
  bool committed_ = false;
};

// --- store ----------------------------------------------------------------------------------

class S3BlobStore final : public BlobStore {
 public:
  explicit S3BlobStore(S3Location loc)
      : s3_(std::make_shared<const S3Client>(std::move(loc))), prefix_(s3_->location().prefix) {}

  Status Init() {
    KILN_ASSIGN_OR_RETURN(S3Reply r, s3_->Send("HEAD", "", {}, {}, {}));
    if (r.status != 200) return s3_->Unexpected("HEAD bucket", "", r, "200");
    return Status::OK();
  }

  Result<std::unique_ptr<BlobWriter>> BeginWrite(const std::string& digest,
                                                 uint64_t expected_size) override {
    KILN_RETURN_IF_ERROR(CheckDigest(digest));
    if (expected_size > kMaxCopyBytes) {
      return Status::InvalidArgument("blob " + digest + ": " + std::to_string(expected_size) +
                                     " bytes; the S3 backend stores at most " +
                                     std::to_string(kMaxCopyBytes) + " (one CopyObject)");
    }
    const std::string hex = digest.substr(7);
    return std::unique_ptr<BlobWriter>(std::make_unique<S3Writer>(
        s3_, digest, expected_size, prefix_ + "staging/" + hex + "." + RandomHex(8),
        FinalKey(digest), &unstaged_));
  }

  bool Has(const std::string& digest) override {
    if (!IsWellFormedDigest(digest)) return false;
    auto r = s3_->Send("HEAD", FinalKey(digest), {}, {}, {});
    if (!r.ok()) {
      KILN_LOG(WARNING) << "s3 blob store: " << r.status().ToString();
      return false;
    }
    if (r->status != 200 && r->status != 404) {
      KILN_LOG(WARNING) << s3_->Unexpected("HEAD", FinalKey(digest), *r, "200 or 404").ToString();
    }
    return r->status == 200;
  }

  // The whole object lands in an unlinked temp file first, so the reader keeps its bytes after
  // a Remove, as on disk, and a dropped connection fails Open rather than a later ReadAt.
  Result<std::unique_ptr<BlobReader>> Open(const std::string& digest) override {
    KILN_RETURN_IF_ERROR(CheckDigest(digest));
    const std::string key = FinalKey(digest);
    FILE* tmp = std::tmpfile();
    if (!tmp) return Status::IOError("s3 blob store: tmpfile: " + std::string(strerror(errno)));
    const int fd = ::dup(::fileno(tmp));
    std::fclose(tmp);
    if (fd < 0) return Status::IOError("s3 blob store: dup: " + std::string(strerror(errno)));
    uint64_t got = 0;
    bool write_failed = false;
    auto r = s3_->Send("GET", key, {}, {}, {}, [&](const char* data, size_t len) {
      size_t done = 0;
      while (done < len) {
        const ssize_t n = ::write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          write_failed = true;
          return false;
        }
        done += static_cast<size_t>(n);
      }
      got += len;
      return true;
    });
    auto fail = [&](Status s) {
      ::close(fd);
      return s;
    };
    if (!r.ok()) return fail(r.status());
    if (write_failed)
      return fail(
          Status::IOError("s3 blob store: spooling " + s3_->Name(key) + ": " + strerror(errno)));
    if (r->status == 404) return fail(Status::NotFound("blob " + digest + " is not stored"));
    if (r->status != 200) return fail(s3_->Unexpected("GET", key, *r, "200"));
    const std::string length = r->Header("Content-Length");
    if (!length.empty() && length != std::to_string(got)) {
      return fail(Status::Refused(StatusCode::kIOError, kRefusalS3BadResponse,
                                  "s3 GET " + s3_->Name(key) + ": " + std::to_string(got) +
                                      " bytes arrived, Content-Length " + length));
    }
    return NewFdBlobReader(fd, got);
  }

  int TempFileCount() override {
    // Every upload not finished: this process's writers that have sent nothing yet, plus the
    // staging objects and unfinished multipart uploads in the bucket (any hub's, live or dead).
    // -1 when the bucket cannot be listed.
    auto staged = ListKeys(prefix_ + "staging/");
    auto uploads =
        s3_->Send("GET", "", {{"uploads", ""}, {"prefix", prefix_ + "staging/"}}, {}, {});
    if (!staged.ok() || !uploads.ok() || uploads->status != 200) return -1;
    int n = unstaged_.load() + static_cast<int>(staged->size());
    for (size_t at = 0; XmlText(uploads->body, "UploadId", &at);) ++n;
    return n;
  }

  Result<std::vector<Stored>> ListStored() override {
    KILN_ASSIGN_OR_RETURN(auto keys, ListKeys(prefix_ + "sha256/"));
    std::vector<Stored> out;
    for (const Listed& l : keys) {
      const std::string digest = "sha256:" + l.key.substr(prefix_.size() + 7);
      if (IsWellFormedDigest(digest)) out.push_back({digest, l.modified, l.size});
    }
    return out;
  }

  Result<std::vector<std::string>> List() override {
    KILN_ASSIGN_OR_RETURN(auto stored, ListStored());
    std::vector<std::string> out;
    for (const auto& s : stored) out.push_back(s.digest);
    return out;
  }

  Status Remove(const std::string& digest) override {
    KILN_RETURN_IF_ERROR(CheckDigest(digest));
    KILN_ASSIGN_OR_RETURN(S3Reply r, s3_->Send("DELETE", FinalKey(digest), {}, {}, {}));
    if (r.status != 204 && r.status != 200 && r.status != 404) {
      return s3_->Unexpected("DELETE", FinalKey(digest), r, "204");
    }
    return Status::OK();
  }

  Status Verify(const std::string& digest) override {
    KILN_ASSIGN_OR_RETURN(auto reader, Open(digest));
    KILN_ASSIGN_OR_RETURN(const std::string got, DigestOfReader(*reader));
    if (got == digest) return Status::OK();
    // Copied aside, then deleted: the bytes stay as evidence and are never served again.
    const std::string key = FinalKey(digest);
    const std::string to =
        prefix_ + "quarantine/" + digest.substr(7) + "." + std::to_string(std::time(nullptr));
    KILN_ASSIGN_OR_RETURN(
        S3Reply copy, s3_->Send("PUT", to, {},
                                {{"x-amz-copy-source",
                                  "/" + s3_->location().bucket + "/" + SigV4UriEncode(key, true)}},
                                {}));
    if (copy.status != 200) return s3_->Unexpected("copy to", to, copy, "200");
    KILN_RETURN_IF_ERROR(Remove(digest));
    KILN_LOG(ERROR) << "s3 blob store: blob " << digest << " hashes to " << got
                    << "; quarantined as " << s3_->Name(to);
    return Status::Refused(StatusCode::kCorruption, kRefusalBlobCorrupt,
                           "blob " + digest + " hashes to " + got + "; quarantined as " +
                               s3_->Name(to) + "; a republish of the cell repairs it");
  }

  Status CheckWritable() override {
    const std::string probe = prefix_ + "staging/ready-probe." + RandomHex(8);
    KILN_ASSIGN_OR_RETURN(S3Reply put, s3_->Send("PUT", probe, {}, {}, "k"));
    if (put.status != 200) return s3_->Unexpected("PUT", probe, put, "200");
    (void)s3_->Send("DELETE", probe, {}, {}, {});
    return Status::OK();
  }

  Result<uint64_t> FreeBytes() override { return uint64_t{UINT64_MAX}; }

  Result<std::string> DirectUrl(const std::string& digest, int64_t ttl_s) override {
    KILN_RETURN_IF_ERROR(CheckDigest(digest));
    if (ttl_s < 1 || ttl_s > kS3MaxPresignSeconds) {
      return Status::InvalidArgument("s3 presigned URL lifetime " + std::to_string(ttl_s) +
                                     " s is outside [1, " + std::to_string(kS3MaxPresignSeconds) +
                                     "]");
    }
    const S3Location& loc = s3_->location();
    const std::string path =
        "/" + SigV4UriEncode(loc.bucket, false) + "/" + SigV4UriEncode(FinalKey(digest), true);
    return SigV4PresignUrl("GET", loc.public_endpoint.empty() ? loc.endpoint : loc.public_endpoint,
                           path, {}, loc.credentials, SigV4Now(), ttl_s);
  }

 private:
  Status CheckDigest(const std::string& digest) const {
    if (IsWellFormedDigest(digest)) return Status::OK();
    return Status::InvalidArgument("blob digest '" + digest + "' is not sha256:<64 hex>");
  }
  std::string FinalKey(const std::string& digest) const {
    return prefix_ + "sha256/" + digest.substr(7);
  }

  // Every key under `prefix` with its LastModified time (ListObjectsV2, all pages).
  struct Listed {
    std::string key;
    int64_t modified = 0;  // unix seconds
    uint64_t size = 0;
  };
  Result<std::vector<Listed>> ListKeys(const std::string& prefix) {
    std::vector<Listed> out;
    std::string token;
    for (int page = 0;; ++page) {
      Query q = {{"list-type", "2"}, {"prefix", prefix}};
      if (!token.empty()) q.emplace_back("continuation-token", token);
      KILN_ASSIGN_OR_RETURN(S3Reply r, s3_->Send("GET", "", q, {}, {}));
      if (r.status != 200) return s3_->Unexpected("list", prefix, r, "200");
      size_t at = 0;
      while (true) {
        const size_t start = r.body.find("<Contents>", at);
        if (start == std::string::npos) break;
        size_t end = r.body.find("</Contents>", start);
        if (end == std::string::npos) break;
        const std::string entry = r.body.substr(start, end - start);
        auto key = XmlText(entry, "Key");
        auto modified = XmlText(entry, "LastModified");
        if (!key || key->compare(0, prefix.size(), prefix) != 0) {
          return Status::Refused(
              StatusCode::kIOError, kRefusalS3BadResponse,
              "s3 list " + s3_->Name(prefix) + ": an entry without a Key under the prefix");
        }
        auto size = XmlText(entry, "Size");
        uint64_t bytes = 0;
        if (size && !size->empty() && size->size() <= 19 &&
            size->find_first_not_of("0123456789") == std::string::npos) {
          bytes = std::stoull(*size);
        }
        out.push_back({*key, modified ? ParseIsoTime(*modified) : 0, bytes});
        at = end;
      }
      if (XmlText(r.body, "IsTruncated").value_or("false") != "true") break;
      token = XmlText(r.body, "NextContinuationToken").value_or("");
      if (token.empty()) {
        return Status::Refused(
            StatusCode::kIOError, kRefusalS3BadResponse,
            "s3 list " + s3_->Name(prefix) + ": truncated without a NextContinuationToken");
      }
    }
    return out;
  }

  std::shared_ptr<const S3Client> s3_;
  std::string prefix_;
  std::atomic<int> unstaged_{0};
};

}  // namespace

Result<S3Location> S3LocationFromUrl(const std::string& url) {
  auto config = [](const std::string& detail) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalS3Config, detail);
  };
  if (url.rfind("s3://", 0) != 0) return config("--blobs '" + url + "' is not s3://bucket/prefix");
  S3Location loc;
  const std::string rest = url.substr(5);
  const size_t slash = rest.find('/');
  loc.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) loc.prefix = rest.substr(slash + 1);
  if (loc.bucket.empty()) return config("--blobs '" + url + "' names no bucket");
  while (!loc.prefix.empty() && loc.prefix.front() == '/') loc.prefix.erase(0, 1);
  if (!loc.prefix.empty() && loc.prefix.back() != '/') loc.prefix += '/';
  loc.endpoint = Env("KILN_S3_ENDPOINT");
  if (loc.endpoint.rfind("http://", 0) != 0 && loc.endpoint.rfind("https://", 0) != 0) {
    return config("--blobs " + url + ": KILN_S3_ENDPOINT is '" + loc.endpoint +
                  "', expected http(s)://host[:port]");
  }
  loc.credentials.access_key = Env("AWS_ACCESS_KEY_ID");
  loc.credentials.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  loc.credentials.session_token = Env("AWS_SESSION_TOKEN");
  if (loc.credentials.access_key.empty() || loc.credentials.secret_key.empty()) {
    return config("--blobs " + url + ": AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set");
  }
  loc.credentials.region = Env("AWS_REGION");
  if (loc.credentials.region.empty()) loc.credentials.region = Env("AWS_DEFAULT_REGION");
  if (loc.credentials.region.empty()) loc.credentials.region = "us-east-1";
  return loc;
}

Result<std::unique_ptr<BlobStore>> OpenS3BlobStore(const S3Location& location) {
  if (location.part_bytes < kMinPartBytes) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalS3Config,
                           "s3 part size " + std::to_string(location.part_bytes) +
                               " is below S3's minimum of " + std::to_string(kMinPartBytes));
  }
  if (const std::string& pub = location.public_endpoint; !pub.empty()) {
    const size_t scheme = pub.find("://");
    const bool http = pub.rfind("http://", 0) == 0 || pub.rfind("https://", 0) == 0;
    if (!http || pub.find_first_of("/?#", scheme + 3) != std::string::npos ||
        pub.size() == scheme + 3) {
      return Status::Refused(StatusCode::kInvalidArgument, kRefusalS3Config,
                             "s3 public endpoint '" + pub +
                                 "' is not http(s)://host[:port] (no path: the bucket follows)");
    }
  }
  auto store = std::make_unique<S3BlobStore>(location);
  KILN_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<BlobStore>(std::move(store));
}

}  // namespace kiln
