// The hard cases: inputs built to break the things sparse-attention kernels get wrong (exact and
// near ties at the top-K cut, a trailing partial chunk, rows with fewer candidates than K, every
// logit above 100 or below -100, nearly uniform softmaxes over thousands of keys, one head of a
// group far more peaked than the others, ...), for a kernel's geometry and head shape, every value
// exact in the kernel's input precision. Each case names what a wrong kernel does there; a kernel
// runs them and the oracle (oracle.hpp) judges its outputs as for any other inputs. The table of
// cases, with the reason for each length and construction, is kHardCases in
// analysis/src/oracle_hard_cases.cpp; data/hard_cases.md describes them for users.
//
// Deterministic: a case's values depend only on its name, the spec's geometry and the head shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hils/analysis/oracle.hpp"
#include "hils/attention.hpp"
#include "hils/spec.hpp"

namespace hils::oracle {

// The kernel's head shape: Hq query heads, Hkv KV heads (Hq % Hkv == 0), head dims d and dv.
struct HeadShape {
  int64_t Hq = 0, Hkv = 0, d = 0, dv = 0;
};

struct HardCaseOptions {
  // The kernel's input precision (an input precision of precision_row: fp32, bf16, fp16): every
  // value is exact in it, so ties survive the kernel's own conversion.
  InputPrecision precision = InputPrecision::fp32;
  // Lengths the kernel takes: every case's T is a multiple of this (a case whose point is a
  // length that no multiple has, e.g. a partial chunk when S divides it, is skipped).
  int64_t length_multiple = 1;
  // The longest T to build (0: no limit); a longer case is skipped, saying its length.
  int64_t max_T = 0;
};

struct HardCase {
  std::string name;
  std::string catches;  // what a wrong kernel does on these inputs, in one sentence
  AttentionInputs<double> inputs;
};

struct SkippedCase {
  std::string name;
  std::string reason;  // e.g. "the spec selects no chunks (fusion full)"
};

struct HardCases {
  std::vector<HardCase> cases;
  std::vector<SkippedCase> skipped;
};

// Every case of the table that the spec, head shape and options allow, in the table's order, and
// the others with the reason each was left out. Throws InvalidArgument naming the field for a
// spec the reference refuses, a head shape with a count < 1 or Hq % Hkv != 0, a precision that is
// no input precision, length_multiple < 1, max_T < 0, or cases whose inputs would exceed 80% of
// memory_limit().
HardCases hard_cases(const MechanismSpec& spec, const HeadShape& shape,
                     const HardCaseOptions& options = {});

// The names of the table's cases, in its order.
std::vector<std::string> hard_case_names();

}  // namespace hils::oracle
