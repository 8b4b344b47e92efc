// What `hils info` says of a file: its kind and attributes, and every dataset, as JSON
// (activation_info, results_info, list_datasets) or as text (print_text).
#pragma once

#include <string>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

namespace hils::cli::info {

// Every dataset below `group` as {path, shape, dtype, meaning}, depth first in name order.
void list_datasets(const H5::Group& group, const std::string& prefix, nlohmann::json& out);
// An activation file's attributes; with `check`, every layer read and validated.
nlohmann::json activation_info(const std::string& path, bool check);
// A results file's provenance, config and complete units.
nlohmann::json results_info(const std::string& path);
// info and datasets as the text report on stdout.
void print_text(const nlohmann::json& info, const nlohmann::json& datasets);

}  // namespace hils::cli::info
