// HubBroker: the hub token held on behalf of a process that must not hold it (client layer;
// docs/trust.md "What a cell can reach"). A `kiln worker` with a hub token runs as two processes:
// the broker (worker/broker.h), which holds the token and runs this relay, and the serving
// process, which loads cells and talks to the hub only through it.
//
// The relay listens on loopback on a port of its own. Every request must carry the capability the
// broker gave the serving process (`Authorization: Bearer <capability>`), else 401
// `broker_unauthenticated`; the capability is worth nothing but this relay's routes and dies with
// the broker. A request on a route a worker uses (BrokerAllows) is sent to the hub with the hub
// token in place of the capability, and the hub's answer is passed back as it came (status, body,
// Content-Type, Location, Retry-After, Content-Range); any other route (the admin routes, the
// dashboard, the tokens) is refused 403 `broker_route_forbidden` without reaching the hub. When
// no answer came from the hub the relay answers the transport token a direct call would have
// seen (`hub_unreachable`, `hub_timeout`, …) with 502 when a GET would be tried again, else 500.
//
// Answers are held whole in memory on their way through (a blob download too: one cell at a time
// per connection).
#pragma once

#include <memory>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/client/hub_client.h"

namespace kiln {

inline constexpr const char* kBrokerUnauthenticated = "broker_unauthenticated";
inline constexpr const char* kBrokerRouteForbidden = "broker_route_forbidden";

// Whether the relay passes `method` `path` (no query) on with the hub token: resolve
// (GET /v1/cells/…), receipts, blobs (GET, PUT, POST …/verify), the publish intent and complete,
// the key set, the revocation list, events (POST), obligation settling and the mint leases.
bool BrokerAllows(const std::string& method, const std::string& path);

struct HubBrokerOptions {
  HubClientOptions hub;               // the hub and the token the relay adds
  std::string capability;             // what the serving process presents (non-empty)
  double publish_io_timeout_s = 900;  // POST /v1/publish/complete waits for the hub's rebuild
};

class HubBroker {
 public:
  // Listens on 127.0.0.1 on a free port and serves until Stop (or destruction).
  static Result<std::unique_ptr<HubBroker>> Start(HubBrokerOptions options);
  ~HubBroker();
  HubBroker(const HubBroker&) = delete;
  HubBroker& operator=(const HubBroker&) = delete;
  int port() const;
  void Stop();

 private:
  HubBroker() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
