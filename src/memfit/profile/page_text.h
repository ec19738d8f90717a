// Text placed inside the self-contained pages (memory.html, curves.html): a script or JSON
// block must not close its <script> element early, and a title must not open a tag; and the
// frame both pages share around their own markup.
#pragma once

#include <string>

#include <fmt/format.h>

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

// A whole self-contained page: the head (the title, escaped; a script that shows script errors
// in #errors and marks the page data-error, for a reader and the headless checks; the style),
// then `body` (the page's own markup), the data as a JSON block and the page's script.
inline std::string page_html(const std::string& title, const char* css, const std::string& body,
                             const std::string& data_json, const char* js) {
  return fmt::format(R"(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{0}</title>
<script>
// Errors go into the page too, where a headless check (and a reader) sees them.
window.addEventListener("error", function (e) {{
  var p = document.getElementById("errors");
  if (p) p.textContent += (e.message || "error") + "\n";
  document.documentElement.setAttribute("data-error", "1");
}});
</script>
<style>
{1}</style>
</head>
<body>
{2}<script id="data" type="application/json">{3}</script>
<script>
{4}</script>
</body>
</html>
)",
                     escape_html(title), css, body, escape_script(data_json), escape_script(js));
}

}  // namespace memfit::profile
