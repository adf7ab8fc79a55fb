// Stop and reload signals of a serving process (see signals.h).
#include "src/kiln/base/signals.h"

#include <pthread.h>

namespace kiln {

sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

bool StopSignalPending(const sigset_t& set) {
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) != 0) return false;
  for (int sig : {SIGINT, SIGTERM}) {
    if (sigismember(&set, sig) == 1 && sigismember(&pending, sig) == 1) return true;
  }
  return false;
}

int WaitForStopSignal(const sigset_t& set, const std::function<void()>& on_hup) {
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    if (on_hup) on_hup();
  }
}

}  // namespace kiln
