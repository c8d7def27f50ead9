#include "ferryctl/report_html.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <string_view>

#include "common/cli.hpp"
#include "common/fd.hpp"
#include "common/json.hpp"
#include "common/signed_records.hpp"
#include "common/signing.hpp"
#include "common/status_macros.hpp"

namespace ferry::ctl {
namespace report_page {
extern const std::string_view kTemplate, kStyle, kBlake2b, kMinisign, kVerdict, kRender, kPage;
}  // namespace report_page

namespace {

constexpr const char* kUsage =
    R"(usage: ferryctl report html FILE.json [--pub KEY.pub] [-o OUT.html] [--allow-unverified]
       ferryctl report html --chain DIR [--pub KEY.pub] [-o OUT.html] [--allow-unverified]

Writes one self-contained HTML page that a reader opens in a browser to check a signed record:
a signed overlap report, tune report or snapshot (FILE.json with FILE.json.minisig beside it),
or with --chain every snapshot record in DIR (snapshot-NNNNNN.json; a symlink or another name
like it refused) and the hash chain between them. The page embeds
the record's exact bytes and signature, checks the minisign signature (Ed25519 over BLAKE2b-512,
and the trusted comment's signature) with the browser's WebCrypto on open, says which key it
checked against, and re-checks against a public key the reader pastes or drops. It loads
nothing from the network.

  --pub KEY.pub       embed this public key (the page says a key in the same file proves only
                      that the record is intact; the reader checks the operator's published
                      key); ferryctl checks the records against it first
  -o OUT.html         where to write the page (default: record.html)
  --allow-unverified  write the page even if a record does not verify against --pub (the page
                      then says it does not verify)
  -h, --help          this help
)";

constexpr size_t kMaxRecordBytes = 16 << 20, kMaxChainRecords = 10000;

int Fail(const std::string& what) { return cli::Fail("ferryctl: report html", what); }

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// snapshot-N.json files of DIR, in sequence order.
Result<std::vector<std::string>> SnapshotFiles(const std::string& dir) {
  FERRY_ASSIGN_OR_RETURN(signing::SnapshotListing listing, signing::ListSnapshots(dir));
  FERRY_RETURN_IF_ERROR(signing::NoStrays(dir, listing));
  const auto& found = listing.snapshots;
  if (found.empty()) return NotFound("no snapshot records (snapshot-NNNNNN.json) in " + dir);
  if (found.size() > kMaxChainRecords)
    return InvalidArgument(dir +
                           " holds more than 10000 snapshots; copy the range to show into a directory of its own");
  std::vector<std::string> out;
  for (auto& [seq, name] : found) out.push_back(dir + "/" + name);
  return out;
}

// Fills {{NAME}} placeholders in one pass, so that nothing filled in is read as a placeholder.
Result<std::string> Fill(std::string_view tpl, const std::vector<std::pair<std::string_view, std::string>>& values) {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t open = tpl.find("{{", at);
    if (open == std::string_view::npos) break;
    const size_t close = tpl.find("}}", open);
    if (close == std::string_view::npos) return Internal("report page template: an unclosed {{");
    const std::string_view name = tpl.substr(open + 2, close - open - 2);
    auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    if (it == values.end()) return Internal("report page template: no value for {{" + std::string(name) + "}}");
    out.append(tpl.substr(at, open - at)).append(it->second);
    at = close + 2;
  }
  out.append(tpl.substr(at));
  return out;
}

bool ContainsNoCase(std::string_view hay, std::string_view needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char x, char y) { return std::tolower(static_cast<unsigned char>(x)) == y; });
  return it != hay.end();
}

std::string HtmlText(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

Result<std::string> BuildReportPage(const PageInput& in) {
  using namespace report_page;
  std::string script;
  for (std::string_view part : {kBlake2b, kMinisign, kVerdict, kRender, kPage}) script.append(part).append("\n");
  // The script and style go inside <script> and <style>: their closing tags must not occur in them.
  if (ContainsNoCase(script, "</script") || ContainsNoCase(kStyle, "</style")) {
    return Internal("the report page's script or style holds its own closing tag");
  }
  std::string data = std::string("{\"kind\":") + (in.chain ? "\"chain\"" : "\"record\"") +
                     ",\"pub_b64\":" + json::String(signing::Base64(in.public_key)) + ",\"records\":[";
  for (size_t i = 0; i < in.records.size(); ++i) {
    const PageRecord& r = in.records[i];
    data += std::string(i ? "," : "") + "{\"file_b64\":\"" + signing::Base64(r.file) + "\",\"data_b64\":\"" +
            signing::Base64(r.record) + "\",\"sig_b64\":\"" + signing::Base64(r.minisig) + "\"}";
  }
  data += "]}";
  // Nothing from outside: no fetches, frames, forms, images or fonts; only this script and style.
  const std::string csp = "default-src 'none'; script-src 'sha256-" + signing::Sha256Base64(script) +
                          "'; style-src 'sha256-" + signing::Sha256Base64(kStyle) +
                          "'; img-src 'none'; connect-src 'none'; font-src 'none'; form-action 'none'; base-uri 'none'";
  return Fill(kTemplate, {{"CSP", csp},
                          {"TITLE", HtmlText(in.title)},
                          {"STYLE", std::string(kStyle)},
                          {"SCRIPT", script},
                          {"DATA", data}});
}

int ReportHtml(const std::vector<std::string>& args) {
  std::string file, chain_dir, pub, out = "record.html";
  bool allow_unverified = false, unverified = false;
  cli::Args a(args);
  while (a.Next()) {
    if (a.IsHelp()) return cli::Help(kUsage);
    if (a.Is("--pub") && a.HasValue())
      pub = a.Value();
    else if (a.Is("--chain") && a.HasValue())
      chain_dir = a.Value();
    else if (a.Is("-o") && a.HasValue())
      out = a.Value();
    else if (a.Is("--allow-unverified"))
      allow_unverified = true;
    else if (a.current().rfind("-", 0) == 0)
      return Fail("unknown option " + a.current() + " (try --help)");
    else if (file.empty())
      file = a.current();
    else
      return Fail("one record at a time (or --chain DIR); '" + a.current() + "' is one too many");
  }
  if (file.empty() == chain_dir.empty()) return Fail("give a record FILE.json or --chain DIR (try --help)");
  PageInput in;
  in.chain = !chain_dir.empty();
  std::vector<std::string> paths;
  if (in.chain) {
    auto files = SnapshotFiles(chain_dir);
    if (!files.ok()) return Fail(files.status().message());
    paths = std::move(*files);
    in.title = "ferry snapshot chain";
  } else {
    paths.push_back(file);
    in.title = "ferry signed record";
  }
  for (const std::string& p : paths) {
    // A record found in DIR is never read through a link: the page is published.
    auto r = signing::ReadSignedFile(p, kMaxRecordBytes, /*follow_links=*/!in.chain);
    if (!r.ok()) return Fail(r.status().message());
    in.records.push_back(PageRecord{BaseName(p), std::move(r->record), std::move(r->minisig)});
  }
  std::string key_id;  // of the key given, once it parsed
  if (!pub.empty()) {
    auto text = ReadWholeFile(pub, 4096);
    if (!text.ok()) return Fail(pub + ": " + text.status().message() + " (not a public key file)");
    auto pk = signing::ParsePublicKey(*text);
    if (!pk.ok()) return Fail(pub + ": " + pk.status().message());
    in.public_key = *text;
    key_id = signing::KeyIdHex(pk->id);
    for (const PageRecord& r : in.records) {
      Status st = signing::VerifyRecord(*pk, r.record, r.minisig).status();
      if (st.ok()) continue;
      unverified = true;
      if (!allow_unverified) {
        return Fail(r.file + " does not verify against " + pub + ": " + st.message() +
                    " (nothing written; --allow-unverified writes a page that says so)");
      }
      std::fprintf(stderr, "ferryctl: report html: warning: %s does not verify against %s: %s (the page says so)\n",
                   r.file.c_str(), pub.c_str(), st.message().c_str());
    }
  }
  auto page = BuildReportPage(in);
  if (!page.ok()) return Fail(page.status().message());
  if (Status st = WriteFileAtomically(out, *page); !st.ok()) return Fail(st.message());
  std::string key_note = ", no key embedded (the reader pastes the operator's published key)";
  if (!pub.empty()) {
    // Only each record's signature is checked here: the chain's links are the page's and ferryctl verify's.
    const char* verdict = unverified ? ", NOT verified by key "
                          : in.chain ? ", each record's signature verified by key "
                                     : ", verified by key ";
    key_note = verdict + key_id + ", which is embedded" +
               (in.chain && !unverified ? " (the chain's links are checked by the page and by ferryctl verify)" : "");
  }
  std::printf("wrote %s: %zu record%s%s\n", out.c_str(), in.records.size(), in.records.size() == 1 ? "" : "s",
              key_note.c_str());
  return 0;
}

}  // namespace ferry::ctl
