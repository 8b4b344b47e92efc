// A kernel's dump for the oracle (data/verify_format.md) read and checked: its spec, precisions,
// inputs, outputs, gradients, and what the format does not define. verify_file.cpp reads the
// file and its attributes, verify_datasets.cpp its datasets; verify_write.cpp writes the inputs
// half of one (hils cases) for a kernel's harness to complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <H5Cpp.h>

#include "hils/analysis/oracle.hpp"

namespace hils::cli::verify {

inline constexpr const char* kVerifyFormat = "hils-verify";
inline constexpr int64_t kVerifyFormatVersion = 1;

struct VerifyFile {
  MechanismSpec spec;
  oracle::VerifyOptions options;
  AttentionInputs<double> inputs;
  oracle::KernelOutputs outputs;
  std::string kernel_name;
  std::vector<std::string> unknown;  // datasets and groups the oracle does not read
};

// file -> its contents, or io::FileError naming the file and the attribute or dataset at fault.
VerifyFile read_verify_file(const std::filesystem::path& file);

// A verify file without outputs: the root attributes format, format_version, spec (JSON, the
// one spec codec) and input_precision, and /inputs (q, k, v; q_retrieval and prior where the
// inputs hold them) as float32 [heads, rows, columns], written to a temporary name and renamed
// over `file` (io::TempFile: never a half-written file). Every value must be exact in float32,
// as an input precision's values are (std::logic_error otherwise: the caller's bug); FileError
// for a folder that cannot be written or a full disk. `queries` (strictly ascending slots) is
// written as /queries when not empty: the rows the kernel's outputs will hold.
void write_verify_inputs(const std::filesystem::path& file, const MechanismSpec& spec,
                         oracle::InputPrecision precision, const AttentionInputs<double>& inputs,
                         const std::vector<int64_t>& queries = {});

// verify_datasets.cpp: the groups of the format, each dataset's shape, type and values checked.
// /inputs: q [Hq,T,d], k [Hkv,T,d], v [Hkv,T,dv], optional q_retrieval [Hq,T,d], prior [Hq,R,d].
AttentionInputs<double> read_inputs(const std::filesystem::path& file, const H5::H5File& h5);
// /outputs: every stage is optional; values may be NaN or Inf (the oracle judges them).
oracle::KernelOutputs read_outputs(const std::filesystem::path& file, const H5::H5File& h5);
// /inputs/do, /inputs/dlse (the upstream gradients) and /grads: the kernel's backward pass.
oracle::KernelGradients read_gradients(const std::filesystem::path& file, const H5::H5File& h5);

}  // namespace hils::cli::verify
