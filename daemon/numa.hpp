// Placeholder until the NUMA layer lands: the NUMA node of a PCI device from sysfs.
#pragma once

#include <cctype>
#include <fstream>
#include <string>
#include <string_view>

namespace ferry::daemon {

inline int NumaNodeOfPciDevice(std::string_view pci_bus_id, const std::string& sysfs = "/sys") {
  std::string id(pci_bus_id);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (id.size() == 16 && id[8] == ':') id = id.substr(4);
  std::ifstream f(sysfs + "/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!(f >> node)) return -1;
  return node < 0 ? -1 : node;
}

}  // namespace ferry::daemon
