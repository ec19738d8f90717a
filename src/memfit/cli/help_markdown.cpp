// Walks the CLI::App tree the binary parses with and prints it as markdown tables: the part of
// docs/cli.md between its generated markers. Generic on purpose: an option or subcommand added
// anywhere appears after `bash scripts/cli_docs.sh`, and the test fails until it is run.
#include "memfit/cli/help_markdown.h"

#include <cstdio>

#include <fmt/format.h>

namespace memfit::cli {

namespace {

// One table cell or paragraph: on one line, with the characters that would end a cell or start
// emphasis or an HTML tag escaped outside `code spans`.
std::string cell(const std::string& text) {
  std::string out;
  bool in_code = false;
  for (char ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
    if (ch == '`') in_code = !in_code;
    if (ch == '|')
      out += "\\|";  // ends a cell even inside a code span
    else if (!in_code && ch == '*')
      out += "\\*";
    else if (!in_code && ch == '<')
      out += "&lt;";
    else
      out += ch;
  }
  return out;
}

bool hidden(const CLI::Option* o) { return o->get_group().empty(); }

std::string option_names(const CLI::Option* o) {
  std::string names;
  auto add = [&](const std::string& n) { names += (names.empty() ? "" : ", ") + ("`" + n + "`"); };
  for (const std::string& s : o->get_snames()) add("-" + s);
  for (const std::string& l : o->get_lnames()) add("--" + l);
  if (names.empty()) add(o->get_name(true));  // a positional argument
  return names;
}

std::string option_value(const CLI::Option* o) {
  if (o->get_expected_max() == 0) return "";  // a flag
  std::string v = o->get_type_name();
  if (o->get_items_expected_max() > 1) v += " ...";
  return cell("`" + v + "`");
}

std::string option_default(const CLI::Option* o) {
  if (o->get_required()) return "required";
  const std::string d = o->get_default_str();
  return d.empty() ? "" : cell("`" + d + "`");
}

void command_markdown(const CLI::App& cmd, const std::string& path, std::string& out) {
  out += fmt::format("### Options of `{}`\n\n", path);
  if (!cmd.get_description().empty()) out += cell(cmd.get_description()) + "\n\n";
  std::vector<const CLI::Option*> options =
      cmd.get_options([](const CLI::Option* o) { return !hidden(o); });
  if (!options.empty()) {
    out += "| option | value | default | description |\n|---|---|---|---|\n";
    for (const CLI::Option* o : options) {
      std::string description = o->get_description();
      if (!o->get_envname().empty())
        description += fmt::format(" (environment: {})", o->get_envname());
      out += fmt::format("| {} | {} | {} | {} |\n", option_names(o), option_value(o),
                         option_default(o), cell(description));
    }
    out += "\n";
  }
  if (!cmd.get_footer().empty()) out += cell(cmd.get_footer()) + "\n\n";
  for (const CLI::App* sub : cmd.get_subcommands([](const CLI::App* s) {
         return !s->get_name().empty() && !s->get_group().empty();
       }))
    command_markdown(*sub, path + " " + sub->get_name(), out);
}

}  // namespace

std::string help_markdown(const CLI::App& app, const std::string& root_name) {
  std::string out;
  command_markdown(app, root_name, out);
  while (out.size() > 1 && out.back() == '\n' && out[out.size() - 2] == '\n') out.pop_back();
  return out;
}

void add_help_markdown_flag(CLI::App& app, const std::string& root_name) {
  app.add_flag_callback("--help-markdown",
                        [&app, root_name] {
                          std::fputs(help_markdown(app, root_name).c_str(), stdout);
                          throw CLI::Success();
                        })
      ->group("")
      ->trigger_on_parse();
}

}  // namespace memfit::cli
