// Where the shared real data (stories260K.bin, tok512.bin, tinystories_sample.txt) lives.
#pragma once

#include <filesystem>

namespace hils {

// $HILS_SHARED_DATA if set, else ../shared/data beside the project root (fixed at configure
// time). The folder may not exist: callers check and say how to get the files.
std::filesystem::path shared_data_dir();

}  // namespace hils
