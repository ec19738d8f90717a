#include "memfit/cli/config_file.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "memfit/core/error.h"

namespace memfit::cli {

namespace {

std::string value_text(const toml::node& node, const std::string& path, const std::string& key) {
  if (auto s = node.as_string()) return s->get();
  if (auto i = node.as_integer()) return std::to_string(i->get());
  if (auto f = node.as_floating_point()) return fmt::format("{}", f->get());
  if (auto b = node.as_boolean()) return b->get() ? "true" : "false";
  MEMFIT_THROW(ConfigError, "config", "{}: key '{}' must be a string, number or boolean", path,
               key);
}

std::vector<std::string> known_keys(CLI::App& cmd) {
  std::vector<std::string> keys;
  for (const CLI::Option* opt : cmd.get_options()) {
    for (const std::string& name : opt->get_lnames())
      if (name != "help" && name != "help-all" && name != "config") keys.push_back(name);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace

void apply_toml_config(CLI::App& cmd, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    MEMFIT_THROW(ConfigError, "config", "--config {}: {}", path,
                 std::filesystem::exists(path, ec) ? "not a file (a TOML file of options)"
                                                   : "no such file");
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    MEMFIT_THROW(ConfigError, "config", "{}:{}:{}: {}", path, e.source().begin.line,
                 e.source().begin.column, e.description());
  }
  std::map<const CLI::Option*, std::string> from_file;  // the key that set each option
  for (auto&& [k, node] : table) {
    std::string key(k.str()), name = key;
    std::replace(name.begin(), name.end(), '_', '-');
    CLI::Option* opt = cmd.get_option_no_throw("--" + name);
    if (opt == nullptr || name == "config" || name == "help")
      MEMFIT_THROW(ConfigError, "config", "{}: unknown key '{}'; known keys: {}", path, key,
                   fmt::join(known_keys(cmd), ", "));
    if (const auto it = from_file.find(opt); it != from_file.end())
      MEMFIT_THROW(ConfigError, "config", "{}: keys '{}' and '{}' both set --{}; keep one", path,
                   it->second, key, name);
    from_file[opt] = key;
    if (opt->count() > 0) continue;  // given on the command line: that wins
    std::vector<std::string> values;
    if (auto arr = node.as_array()) {
      for (auto&& item : *arr) values.push_back(value_text(item, path, key));
    } else {
      values.push_back(value_text(node, path, key));
    }
    try {
      for (const std::string& v : values) opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      MEMFIT_THROW(ConfigError, "config", "{}: key '{}': {}", path, key, e.what());
    }
  }
}

}  // namespace memfit::cli
