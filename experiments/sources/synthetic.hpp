// Seeded synthetic activations: the one generator family behind `hils dump synthetic` and the
// studies' synthetic source (`[source] kind = "synthetic"`), with one set of parameter names.
//
// Statistical models. gaussian, topics and needle draw from independent seeded streams, one per
// tensor and head, so turning on one option never changes another tensor's values; drift draws
// everything from one stream in a fixed order (the studies' model since their first results).
//
// - gaussian: every entry of q, k, v is i.i.d. N(0, 1); q is then multiplied by `logit_std`.
//   With sigma = 1/sqrt(d) the logit s = sigma q.k of a query with a key is ~N(0, logit_std^2):
//   `logit_std` is the flat <-> peaked knob of the paper's Eq. 5. Near 0 the logits inside a
//   chunk are nearly uniform (LSE ~ mean + log S); large values let one logit dominate
//   (LSE ~ max).
// - topics: every complete chunk c of KV head g has a topic u_{g,c} ~ N(0, I_d). A key of chunk c
//   is sqrt(rho) u_c + sqrt(1-rho) e, e ~ N(0, I), rho = `topic_share`. A query at slot t is
//   logit_std * (sqrt(rho_q) u_{c*} + sqrt(1-rho_q) e) with rho_q = `query_topic_share` and c*
//   uniform over the complete chunks that end before t (its own chunk's topic when none does);
//   a landmark slot's query is drawn toward its own chunk's topic (it summarises that chunk).
//   Values are i.i.d. N(0, 1).
// - needle: the gaussian model plus one planted key per KV head: at the real token at `depth`
//   (0 = first real token, 1 = last) the key is replaced by a multiple of the query of the first
//   head of the group at `needle_query` (default the last real token), scaled so that the
//   needle's logit for that query is exactly `needle_logit` (analysis/needle.hpp, the planter the
//   extrapolation study shares). The sample reports where it is.
// - drift (the studies' default): the slots are cut into topic segments of random length
//   (exponential, mean `segment` slots); a key is its segment's topic ~ N(0, I) plus
//   `key_noise` N(0, I). A query drifts: AR(1) over slots with correlation `query_rho` and unit
//   variance, times `logit_std` (so sigma q.k has std ~ logit_std sqrt(1 + key_noise^2)), so
//   adjacent queries retrieve similar chunks, as in a language model. Values are i.i.d. N(0, 1).
//   With landmarks, a landmark slot carries the mean of its chunk's other slots (q, k and v:
//   a stand-in for a trained landmark). No prior row.
//
// Layers: `layer` (default 0) selects an independent draw of the same model; layer 0 of the
// stream models is what a file from `hils dump synthetic` holds.
//
// Layout: T slots of chunk size S; with `landmarks`, slot (c+1)S-1 of every complete chunk is a
// landmark slot (drawn like any other slot except under drift, see above). Position ids follow
// hils::Geometry.
//
// Positional structure: vectors are drawn un-rotated; `positional` (rope or hope; none by
// default) is then applied with the reference's apply_positional_encoding at the geometry's
// position ids. `unrotated` keeps the vectors before rotation so that a study can apply RoPE,
// HoPE or NoPE itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/attention.hpp"
#include "io/activation_file.hpp"

namespace hils::sources {

struct SyntheticParams {
  std::string generator = "gaussian";  // gaussian | topics | needle | drift
  int64_t T = 1024;                    // slots, landmark slots included
  int64_t S = 64;                      // chunk size of the slot layout
  bool landmarks = true;               // HiLS layout: a landmark slot ends every complete chunk
  int64_t Hq = 4, Hkv = 2, d = 64;
  int64_t dv = 0;                      // value head dim; 0: the same as d
  double logit_std = 1.0;              // flat (-> 0) <-> peaked (large) knob, see above
  double topic_share = 0.7;            // topics: rho, share of a key's variance from its topic
  double query_topic_share = 0.5;      // topics: rho_q for queries
  double depth = 0.5;                  // needle: where the needle key sits, in [0, 1]
  int64_t needle_query = -1;           // needle: query slot aligned with it; -1 = last real token
  double needle_logit = 8.0;           // needle: its logit for that query
  int64_t segment = 192;               // drift: mean topic segment length in slots
  double key_noise = 0.6;              // drift: key noise std (the topic has unit variance)
  double query_rho = 0.98;             // drift: adjacent-slot correlation of the query drift
  double retrieval_noise = 0.0;        // > 0: q_retrieval = q + logit_std * noise * N(0, I)
  PositionalEncoding positional{};     // nope by default
  uint64_t seed = 0;

  int64_t value_dim() const { return dv > 0 ? dv : d; }
  // Bytes that generating one layer of T slots holds at once, roughly: the rotated and
  // un-rotated inputs, a copy and a writer's buffer, all in double (hils dump synthetic and the
  // studies' synthetic source check it against the machine's memory before generating).
  double working_bytes() const;
  // Throws InvalidArgument naming the first field that makes no sense.
  void validate() const;
  // The generator, the fields every generator uses and its own (dv resolved).
  nlohmann::json to_json() const;
};

// Where a planted needle sits.
struct Needle {
  int64_t kv_head = 0;
  int64_t slot = 0;         // slot of the needle key
  int64_t chunk = 0;        // its chunk, floor(slot / S)
  int64_t query_slot = 0;   // the query it is aligned with
  int64_t query_head = 0;   // the query head whose query it copies
};

struct SyntheticSample {
  AttentionInputs<double> inputs;     // positional encoding applied when positional != nope;
                                      // prior holds one N(0, logit_std^2) row per query head
                                      // (rotated per chunk when a positional encoding applies)
  AttentionInputs<double> unrotated;  // the same vectors before any rotation
  Geometry geometry;
  std::vector<int64_t> position_ids;  // [T]
  std::vector<Needle> needles;        // one per KV head for the needle generator, else empty
  nlohmann::json description;         // params as JSON, for provenance
};

// One layer's un-rotated inputs (prior: one N(0, logit_std^2) row per query head, none under
// drift) and the needles planted in them; what every other entry point builds on.
struct SyntheticLayer {
  AttentionInputs<double> inputs;
  std::vector<Needle> needles;
};
SyntheticLayer draw_layer(const SyntheticParams& params, int64_t layer = 0);

// Layer `layer` with the positional encoding applied and its description.
SyntheticSample generate(const SyntheticParams& params, int64_t layer = 0);

// A one-layer activation file of the sample: q, k (rotated when a positional encoding was
// applied, with q_unrotated/k_unrotated stored), v, q_retrieval if any; landmarks and position
// ids from the geometry; source = the description (and needle positions).
io::ActivationFile to_activation_file(const SyntheticSample& sample);

std::vector<std::string> generator_names();

}  // namespace hils::sources
