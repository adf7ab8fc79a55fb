// A private certificate authority made at test time with OpenSSL (tests of the net layer and the
// TLS end-to-end tests): a self-signed CA and server certificates it signs for localhost and
// 127.0.0.1, written as PEM files. Nothing is downloaded or kept between runs.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>
#include <string>

namespace kiln::net_testing {

struct PemFiles {
  std::string cert;  // path of the PEM certificate
  std::string key;   // path of the PEM private key
};

class TestCa {
 public:
  // A CA named `name`; its certificate is written to `dir`/`name`-ca.pem.
  TestCa(const std::string& dir, const std::string& name) : dir_(dir), name_(name) {
    key_.reset(NewKey());
    cert_.reset(X509_new());
    Fill(cert_.get(), name + " test CA", 1);
    X509_set_issuer_name(cert_.get(), X509_get_subject_name(cert_.get()));
    X509_set_pubkey(cert_.get(), key_.get());
    AddExt(cert_.get(), cert_.get(), NID_basic_constraints, "critical,CA:TRUE");
    AddExt(cert_.get(), cert_.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
    X509_sign(cert_.get(), key_.get(), EVP_sha256());
    ca_path_ = dir + "/" + name + "-ca.pem";
    WriteCert(ca_path_, cert_.get());
  }

  const std::string& ca_path() const { return ca_path_; }

  // A server certificate for localhost and 127.0.0.1 signed by this CA, written as
  // `dir`/`file_stem`.crt and .key (overwriting: a rotation).
  PemFiles Issue(const std::string& file_stem, long serial) const {
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(NewKey(), EVP_PKEY_free);
    std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
    Fill(cert.get(), "localhost", serial);
    X509_set_issuer_name(cert.get(), X509_get_subject_name(cert_.get()));
    X509_set_pubkey(cert.get(), key.get());
    AddExt(cert.get(), cert_.get(), NID_basic_constraints, "critical,CA:FALSE");
    AddExt(cert.get(), cert_.get(), NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
    AddExt(cert.get(), cert_.get(), NID_ext_key_usage, "serverAuth");
    X509_sign(cert.get(), key_.get(), EVP_sha256());
    PemFiles out{dir_ + "/" + file_stem + ".crt", dir_ + "/" + file_stem + ".key"};
    // Written beside, then renamed over: a reader never sees half a file.
    WriteCert(out.cert + ".tmp", cert.get());
    FILE* f = std::fopen((out.key + ".tmp").c_str(), "w");
    PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    std::rename((out.key + ".tmp").c_str(), out.key.c_str());
    std::rename((out.cert + ".tmp").c_str(), out.cert.c_str());
    return out;
  }

 private:
  static EVP_PKEY* NewKey() { return EVP_EC_gen("P-256"); }

  static void Fill(X509* cert, const std::string& cn, long serial) {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), serial);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  }

  static void AddExt(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  static void WriteCert(const std::string& path, X509* cert) {
    FILE* f = std::fopen(path.c_str(), "w");
    PEM_write_X509(f, cert);
    std::fclose(f);
  }

  std::string dir_, name_, ca_path_;
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key_{nullptr, EVP_PKEY_free};
  std::unique_ptr<X509, decltype(&X509_free)> cert_{nullptr, X509_free};
};

}  // namespace kiln::net_testing
