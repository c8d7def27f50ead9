// Where ferryd's control socket is when nobody says: $FERRY_SOCKET, else the packaged path.
// libferry's DefaultSocketPath() and the operator's tools read it here.
#pragma once

#include <cstdlib>
#include <string>

namespace ferry {

inline std::string DefaultFerrydSocket() {
  if (const char* s = std::getenv("FERRY_SOCKET"); s != nullptr && *s != '\0') return s;
  return "/run/ferry/ferryd.sock";
}

}  // namespace ferry
