// Small path helpers shared by mpsshimd and mpsshimctl.
#pragma once

#include <string>

namespace mpsshim::daemon {

// `path` made absolute against the current directory: mpsshimd -d changes to / before it uses
// the paths it was given.
std::string absolute_path(const std::string& path);

}  // namespace mpsshim::daemon
