// `ferryctl report html`: one self-contained HTML page that checks a signed record (an overlap
// or tune report, a snapshot) or a chain of snapshots in the reader's browser.
#pragma once

#include <string>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::ctl {

struct PageRecord {
  std::string file;    // the name the page shows
  std::string record;  // the exact bytes signed
  std::string minisig;
};

struct PageInput {
  bool chain = false;
  std::string title;
  std::string public_key;  // a .pub's text; empty: none embedded
  std::vector<PageRecord> records;
};

// The page: the template with its style, script and the records (base64) filled in, and a
// Content-Security-Policy that lets only that script and style run and fetches nothing.
Result<std::string> BuildReportPage(const PageInput& in);

// The arguments after "report html"; returns the exit code.
int ReportHtml(const std::vector<std::string>& args);

}  // namespace ferry::ctl
