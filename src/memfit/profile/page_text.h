// Text placed inside the self-contained pages (memory.html, curves.html): a script or JSON
// block must not close its <script> element early, and a title must not open a tag.
#pragma once

#include <string>

namespace memfit::profile {

// For inside a <script> element: every "</" becomes "<\/" (the same string to JavaScript and
// to JSON, and no closing tag to the HTML parser).
inline std::string escape_script(std::string s) {
  for (size_t at = 0; (at = s.find("</", at)) != std::string::npos; at += 3) s.replace(at, 2, "<\\/");
  return s;
}

// For an element's text (a <title>).
inline std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace memfit::profile
