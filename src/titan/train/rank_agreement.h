// Ranks that disagree stop at start-up: every rank of a multi-process `titan train` compares the
// fingerprint of the titan binary it runs and its resolved job config (every key, as
// --print-config prints them) with rank 0's, before the mesh is made or anything is read. A rank
// launched with another training.seq_len, seed, flavor, dtype, checkpoint setting or binary would
// otherwise train a wrong model silently, abort inside MPI (MPI_ERR_TRUNCATE) or wait out the
// collective timeout; instead the job ends in one line naming the lowest rank that differs and
// its first differing key, with its value and rank 0's.
#pragma once

#include <string>
#include <vector>

#include "titan/distributed/communicator.h"
#include "titan/train/job_config.h"

namespace titan {

// "section.key = value" for every key of `config`, in --print-config's order (job_config_to_toml).
std::vector<std::string> job_config_lines(const JobConfig& config);

// This binary's fingerprint: FNV-1a over /proc/self/exe's bytes (titan links its library
// statically), or, where it cannot be read, the reason.
std::string binary_fingerprint();

// The first difference of `mine` from `rank0` (the binary's fingerprint first, then the config
// lines: "has KEY = MINE, rank 0 has THEIRS"), or "" when they agree. Each list: the fingerprint
// line, then job_config_lines.
std::string first_difference(const std::vector<std::string>& mine,
                             const std::vector<std::string>& rank0);

// Collective over `world` (every rank calls it, in a world of one it returns at once): titan::Error
// on every rank when any rank's binary or config differs from rank 0's -- "ranks disagree: rank R
// <first difference> (N of M ranks differ from rank 0)" -- else nothing.
void check_ranks_agree(Communicator& world, const JobConfig& config);

}  // namespace titan
