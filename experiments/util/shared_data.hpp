// Where the shared real data (stories260K.bin, tok512.bin, tinystories_sample.txt) lives.
#pragma once

#include <filesystem>

namespace hils {

// $HILS_SHARED_DATA if set, else ../shared/data beside the project root (fixed at configure
// time). The folder may not exist: callers check and say how to get the files.
std::filesystem::path shared_data_dir();

// $HILS_PLOTS_DIR if set, else the project's analysis/plots folder (fixed at configure time, an
// absolute path: __FILE__ is relative under ccache's CCACHE_BASEDIR and broke plotting).
std::filesystem::path plots_dir();

}  // namespace hils
