// The negotiated collectives of include/pipesgd/collectives.h through the public API, as threads:
// every dtype x reduction at 1, 2 and 3 workers against closed forms, alltoall with uneven splits,
// reducescatter with uneven rows, process sets (a rank in none of them), join with uneven inputs,
// asynchronous handles completed out of order, blocking collectives run by the caller while the
// communication thread holds asynchronous ones, Horovod's timeline, and the errors (a mismatch,
// Adasum, a set not joined).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/temp_dir.h"
#include "pipesgd/pipesgd.h"

namespace {

using pipesgd::Collective;
using pipesgd::CollectiveKind;
using pipesgd::ReduceOp;
using pipesgd::Worker;

constexpr std::int64_t kElements = 7;

// Rank r's element i: 1..3, so that sums, products (<= 27), minima and maxima are exact in every
// dtype, bool included (odd = true).
torch::Tensor contribution(int rank, c10::ScalarType type) {
  torch::Tensor values = torch::arange(kElements, torch::kInt64).add(rank).remainder(3).add(1);
  if (type == torch::kBool) return values.remainder(2).eq(1);
  return values.to(type);
}

// The reduction over ranks 0..n-1 computed here in int64 (the oracle), in the result dtype.
torch::Tensor expected_reduction(int n, c10::ScalarType type, ReduceOp op) {
  std::vector<torch::Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(contribution(r, type).to(torch::kInt64));
  torch::Tensor stacked = torch::stack(all);
  torch::Tensor result;
  switch (op) {
    case ReduceOp::kSum: result = stacked.sum(0); break;
    case ReduceOp::kAverage: result = stacked.sum(0); break;
    case ReduceOp::kMin: result = std::get<0>(stacked.min(0)); break;
    case ReduceOp::kMax: result = std::get<0>(stacked.max(0)); break;
    case ReduceOp::kProduct: result = stacked.prod(0); break;
    case ReduceOp::kAdasum: break;
  }
  if (type == torch::kBool) return result.ne(0);
  if (op == ReduceOp::kAverage) {
    if (c10::isIntegralType(type, false)) return result.div(n, "trunc").to(type);
    return (result.to(torch::kFloat64) / n).to(type);
  }
  return result.to(type);
}

struct DtypeCase {
  int workers;
  c10::ScalarType type;
};

std::ostream& operator<<(std::ostream& out, const DtypeCase& c) {
  return out << c10::toString(c.type) << " at " << c.workers << " workers";
}

class TypedCollectives : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(TypedCollectives, EveryReductionMatchesClosedForm) {
  const DtypeCase c = GetParam();
  pipesgd::run_threads(c.workers, [&](Worker& w) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      SCOPED_TRACE(pipesgd::reduce_op_name(op));
      torch::Tensor tensor = contribution(w.rank(), c.type);
      if (c.type == torch::kBool && op == ReduceOp::kAverage) {
        EXPECT_THROW(w.allreduce(tensor, op), pipesgd::UsageError);
        continue;
      }
      w.allreduce(tensor, op);
      EXPECT_TRUE(torch::equal(tensor, expected_reduction(c.workers, c.type, op))) << tensor;
    }
  });
}

TEST_P(TypedCollectives, BroadcastAllgatherAlltoallReducescatter) {
  const DtypeCase c = GetParam();
  const int n = c.workers;
  pipesgd::run_threads(n, [&](Worker& w) {
    const int r = w.rank();
    for (int root = 0; root < n; ++root) {
      torch::Tensor tensor = contribution(r, c.type);
      w.broadcast(tensor, root);
      EXPECT_TRUE(torch::equal(tensor, contribution(root, c.type)));
    }
    // allgather: rank q contributes q + 1 rows of its contribution.
    torch::Tensor rows = contribution(r, c.type).unsqueeze(0).expand({r + 1, kElements}).contiguous();
    torch::Tensor gathered = w.allgather(rows);
    ASSERT_EQ(gathered.size(0), n * (n + 1) / 2);
    for (int q = 0, row = 0; q < n; ++q) {
      for (int k = 0; k <= q; ++k, ++row) EXPECT_TRUE(torch::equal(gathered[row], contribution(q, c.type)));
    }
    // alltoall: rank r sends (r + k) % 3 rows to rank k, each row filled with r's contribution.
    Collective alltoall;
    alltoall.kind = CollectiveKind::kAlltoall;
    std::int64_t sent = 0;
    for (int k = 0; k < n; ++k) {
      alltoall.splits.push_back((r + k) % 3);
      sent += (r + k) % 3;
    }
    alltoall.input = contribution(r, c.type).unsqueeze(0).expand({sent, kElements}).contiguous();
    const std::vector<torch::Tensor> exchanged = w.submit(alltoall)->wait();
    ASSERT_EQ(exchanged.size(), 2u);
    std::int64_t row = 0;
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(exchanged[1][q].item<std::int64_t>(), (q + r) % 3);
      for (int k = 0; k < (q + r) % 3; ++k, ++row) EXPECT_TRUE(torch::equal(exchanged[0][row], contribution(q, c.type)));
    }
    EXPECT_EQ(exchanged[0].size(0), row);
    // reducescatter (Sum) of 2n + 1 rows: the first member gets 3 rows, the others 2.
    if (c.type != torch::kBool) {
      Collective scatter;
      scatter.kind = CollectiveKind::kReducescatter;
      scatter.op = ReduceOp::kSum;
      scatter.input = contribution(r, c.type).unsqueeze(0).expand({2 * n + 1, kElements}).contiguous();
      const torch::Tensor mine = w.submit(scatter)->wait().at(0);
      ASSERT_EQ(mine.size(0), r == 0 ? 3 : 2);
      for (std::int64_t k = 0; k < mine.size(0); ++k) {
        EXPECT_TRUE(torch::equal(mine[k], expected_reduction(n, c.type, ReduceOp::kSum)));
      }
    }
  });
}

std::vector<DtypeCase> dtype_cases() {
  std::vector<DtypeCase> cases;
  for (const int workers : {1, 2, 3}) {
    for (const c10::ScalarType type : {torch::kUInt8, torch::kInt8, torch::kInt16, torch::kInt32, torch::kInt64,
                                       torch::kFloat16, torch::kBFloat16, torch::kFloat32, torch::kFloat64, torch::kBool}) {
      cases.push_back({workers, type});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, TypedCollectives, ::testing::ValuesIn(dtype_cases()),
                         [](const ::testing::TestParamInfo<DtypeCase>& info) {
                           return std::string(c10::toString(info.param.type)) + "_" +
                                  std::to_string(info.param.workers) + "_workers";
                         });

TEST(ScaleFactors, IntegersScaleInFloat64AndTruncateAsHorovod) {
  pipesgd::run_threads(2, [](Worker& w) {
    Collective call;
    call.kind = CollectiveKind::kAllreduce;
    call.op = ReduceOp::kSum;
    call.input = torch::tensor({7, -7, 3}, torch::kInt32);
    call.prescale = 0.5;   // 3.5 -> 3, -3.5 -> -3, 1.5 -> 1 on each rank
    call.postscale = 1.5;  // 6 * 1.5 = 9, -9, 3
    EXPECT_TRUE(torch::equal(w.submit(call)->wait().at(0), torch::tensor({9, -9, 3}, torch::kInt32)));
    call.input = torch::tensor({0.25, -1.0}, torch::kFloat64);
    call.op = ReduceOp::kAverage;
    call.prescale = 4.0;
    call.postscale = 0.5;  // mean(1, -4) * 0.5
    EXPECT_TRUE(torch::equal(w.submit(call)->wait().at(0), torch::tensor({0.5, -2.0}, torch::kFloat64)));
  });
}

TEST(ProcessSets, RanksOutsideASetAreNotInvolved) {
  pipesgd::run_threads(4, [](Worker& w) {
    const int r = w.rank();
    const int outer = w.add_process_set({0, 2});  // rank 1 and 3 are in no set but the global one
    const int single = w.add_process_set({3});
    EXPECT_EQ(w.process_set_ranks(outer), (std::vector<int>{0, 2}));
    if (r == 0 || r == 2) {
      Collective call;
      call.kind = CollectiveKind::kAllreduce;
      call.op = ReduceOp::kSum;
      call.process_set = outer;
      call.input = torch::full({3}, static_cast<float>(r + 1));
      EXPECT_TRUE(torch::equal(w.submit(call)->wait().at(0), torch::full({3}, 4.0f)));  // 1 + 3
      Collective gather;
      gather.kind = CollectiveKind::kAllgather;
      gather.process_set = outer;
      gather.input = torch::full({1}, static_cast<float>(r));
      EXPECT_TRUE(torch::equal(w.submit(gather)->wait().at(0), torch::tensor({0.0f, 2.0f})));
    } else if (r == 3) {
      Collective call;
      call.kind = CollectiveKind::kBroadcast;
      call.process_set = single;
      call.root = 3;
      call.input = torch::ones({2});
      EXPECT_TRUE(torch::equal(w.submit(call)->wait().at(0), torch::ones({2})));
    }
    // Rank 1 takes no part: it is in no set, and the others' collectives complete without it.
    Collective outside;
    outside.kind = CollectiveKind::kBarrier;
    outside.process_set = outer;
    if (r == 1) EXPECT_THROW(w.submit(outside), pipesgd::UsageError);
    w.barrier();
    w.remove_process_set(outer);
    w.remove_process_set(single);
    EXPECT_THROW(w.process_set_ranks(outer), pipesgd::UsageError);
  });
}

TEST(Join, UnevenInputsAllreduceZerosAndReturnTheLastRank) {
  const int n = 3;
  pipesgd::run_threads(n, [&](Worker& w) {
    const int r = w.rank();
    // Rank r has r + 1 batches; batch b's Sum counts the ranks that still have data.
    for (int batch = 0; batch <= r; ++batch) {
      torch::Tensor active = torch::ones({4}, torch::kInt64);
      w.allreduce(active, ReduceOp::kSum);
      EXPECT_TRUE(torch::equal(active, torch::full({4}, static_cast<std::int64_t>(n - batch), torch::kInt64)));
      torch::Tensor mean = torch::full({2}, 6.0);
      w.allreduce(mean, ReduceOp::kAverage);  // joined ranks count in the denominator
      EXPECT_TRUE(torch::allclose(mean, torch::full({2}, 6.0 * (n - batch) / n)));
    }
    Collective join;
    join.kind = CollectiveKind::kJoin;
    EXPECT_EQ(w.submit(join)->wait().at(0).item<std::int64_t>(), n - 1);
  });
}

TEST(Join, AnAllgatherThatNeedsAJoinedRankFails) {
  pipesgd::run_threads(2, [](Worker& w) {
    Collective join;
    join.kind = CollectiveKind::kJoin;
    if (w.rank() == 0) {
      EXPECT_EQ(w.submit(join)->wait().at(0).item<std::int64_t>(), 1);
      return;
    }
    try {
      w.allgather(torch::ones({2}));
      ADD_FAILURE() << "no error";
    } catch (const pipesgd::CollectiveMismatchError& error) {
      EXPECT_NE(std::string(error.what()).find("rank 0 has joined"), std::string::npos) << error.what();
    }
    EXPECT_EQ(w.submit(join)->wait().at(0).item<std::int64_t>(), 1);
  });
}

TEST(Asynchronous, HandlesCompleteInAnyOrderAndRunWhileTheCallerWaitsOnSomethingElse) {
  pipesgd::run_threads(2, [](Worker& w) {
    std::vector<std::shared_ptr<pipesgd::Work>> works;
    for (int k = 0; k < 8; ++k) {
      Collective call;
      call.kind = CollectiveKind::kAllreduce;
      call.name = "tensor." + std::to_string(k);
      call.op = ReduceOp::kSum;
      call.input = torch::full({1000}, static_cast<float>(k));
      works.push_back(w.submit(call));
    }
    for (int k = 7; k >= 0; --k) {
      EXPECT_TRUE(torch::equal(works[static_cast<std::size_t>(k)]->wait().at(0), torch::full({1000}, 2.0f * k)));
      EXPECT_TRUE(works[static_cast<std::size_t>(k)]->is_completed());
    }
  });
}

// A blocking collective runs on the caller's thread when the communication thread is idle, on that
// thread when it holds collectives of its own: here rank 0's holds "late" (rank 1 submits it only
// after the blocking ones) while rank 1's is idle, so each blocking allreduce pairs a caller with
// a communication thread.
TEST(Asynchronous, BlockingCollectivesRunWhileAnAsynchronousOneWaitsForItsPeer) {
  pipesgd::run_threads(2, [](Worker& w) {
    Collective late;
    late.kind = CollectiveKind::kAllreduce;
    late.name = "late";
    late.op = ReduceOp::kSum;
    late.input = torch::full({5}, static_cast<float>(w.rank() + 1));
    std::shared_ptr<pipesgd::Work> pending;
    if (w.rank() == 0) pending = w.submit(late);
    for (int k = 0; k < 50; ++k) {
      torch::Tensor tensor = torch::full({3}, static_cast<float>(k + w.rank()));
      w.allreduce(tensor, ReduceOp::kSum);
      EXPECT_TRUE(torch::equal(tensor, torch::full({3}, static_cast<float>(2 * k + 1)))) << "allreduce " << k;
    }
    if (w.rank() == 1) pending = w.submit(late);
    EXPECT_TRUE(torch::equal(pending->wait().at(0), torch::full({5}, 3.0f)));
  });
}

// A name is taken until its collective finished and was waited for (or its Work dropped), so that a
// second submission of it fails the same way whether the first is still in flight or not.
TEST(Asynchronous, ANameIsTakenUntilItsWorkIsWaitedForOrDropped) {
  pipesgd::run_threads(2, [](Worker& w) {
    Collective call;
    call.kind = CollectiveKind::kAllreduce;
    call.name = "reused";
    call.input = torch::ones({2});
    std::shared_ptr<pipesgd::Work> first = w.submit(call);
    while (!first->is_completed()) std::this_thread::yield();
    EXPECT_THROW(w.submit(call), pipesgd::UsageError);  // finished, not waited for
    first->wait();
    std::shared_ptr<pipesgd::Work> second = w.submit(call);
    while (!second->is_completed()) std::this_thread::yield();
    second.reset();  // dropped: free
    EXPECT_TRUE(torch::equal(w.run(call).at(0), torch::ones({2})));
  });
}

TEST(Asynchronous, NamedCollectivesMatchByNameNotOrder) {
  pipesgd::run_threads(2, [](Worker& w) {
    std::vector<std::string> names = {"a", "b", "c"};
    if (w.rank() == 1) std::reverse(names.begin(), names.end());
    std::vector<std::shared_ptr<pipesgd::Work>> works;
    for (const std::string& name : names) {
      Collective call;
      call.kind = CollectiveKind::kAllreduce;
      call.name = name;
      call.op = ReduceOp::kSum;
      call.input = torch::full({2}, static_cast<float>(name[0]));
      works.push_back(w.submit(call));
    }
    for (std::size_t k = 0; k < names.size(); ++k) {
      EXPECT_TRUE(torch::equal(works[k]->wait().at(0), torch::full({2}, 2.0f * names[k][0])));
    }
  });
}

TEST(Errors, MismatchedShapesFailOnEveryRankWithHorovodsWording) {
  std::atomic<int> failures{0};
  pipesgd::run_threads(2, [&](Worker& w) {
    torch::Tensor tensor = torch::ones({w.rank() == 0 ? 3 : 4});
    try {
      w.allreduce(tensor, ReduceOp::kSum);
    } catch (const pipesgd::CollectiveMismatchError& error) {
      EXPECT_NE(std::string(error.what()).find("Mismatched allreduce tensor shapes: One rank sent a tensor of shape [3], "
                                               "but another rank sent a tensor of shape [4]."),
                std::string::npos)
          << error.what();
      ++failures;
    }
    w.barrier();  // the world goes on after a mismatch
  });
  EXPECT_EQ(failures.load(), 2);
}

TEST(Errors, AdasumAndUnknownSetsAreUsageErrors) {
  pipesgd::run_threads(1, [](Worker& w) {
    torch::Tensor tensor = torch::ones({2});
    EXPECT_THROW(w.allreduce(tensor, ReduceOp::kAdasum), pipesgd::UsageError);
    Collective call;
    call.kind = CollectiveKind::kBarrier;
    call.process_set = 7;
    EXPECT_THROW(w.submit(call), pipesgd::UsageError);
    EXPECT_THROW(w.remove_process_set(0), pipesgd::UsageError);
    Collective scalar;
    scalar.kind = CollectiveKind::kReducescatter;
    scalar.input = torch::tensor(1.0f);
    EXPECT_THROW(w.submit(scalar), pipesgd::UsageError);
  });
}

// Horovod's timeline: rank 0 writes what it took part in (a track per name, every rank's
// readiness, the negotiation, the operation; CYCLE_START per round with mark_cycles); ranks 1, 2
// write nothing; a collective of a set without rank 0 is not in it.
TEST(Timeline, RankZeroWritesHorovodsActivitiesOfItsCollectives) {
  const pipesgd::TempDir dir;
  pipesgd::run_threads(3, [&](Worker& w) {
    const int others = w.add_process_set({1, 2});
    const std::string path = dir.file("timeline-" + std::to_string(w.rank()) + ".json");
    w.start_timeline(path, /*mark_cycles=*/true);
    w.start_timeline(path);  // the same file: goes on (as Horovod)
    EXPECT_THROW(w.start_timeline(path + ".other"), pipesgd::UsageError);
    Collective grad;
    grad.kind = CollectiveKind::kAllreduce;
    grad.name = "grad";
    grad.input = torch::ones({4});
    w.run(grad);
    w.barrier();
    if (w.rank() > 0) {
      Collective excluded = grad;
      excluded.name = "excluded";
      excluded.process_set = others;
      w.run(excluded);
    }
    w.stop_timeline();
    w.stop_timeline();  // without a timeline: nothing
  });
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"timeline-0.json"});
  std::ifstream in(dir.file("timeline-0.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::string> tracks;
  std::map<std::string, std::vector<const nlohmann::json*>> on_track;
  std::set<std::int64_t> ready_ranks;
  int cycles = 0;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("name") == "thread_name") tracks[event.at("tid").get<int>()] = event.at("args").at("name");
  }
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M") continue;
    const std::string& track = tracks.at(event.at("tid").get<int>());
    on_track[track].push_back(&event);
    if (event.at("name") == "CYCLE_START") ++cycles;
    if (event.at("name") == "RANK_READY" && track == "allreduce.grad") ready_ranks.insert(event.at("args").at("worker").get<std::int64_t>());
  }
  EXPECT_GE(cycles, 2);
  EXPECT_EQ(ready_ranks, (std::set<std::int64_t>{0, 1, 2}));
  ASSERT_TRUE(on_track.count("allreduce.grad"));
  ASSERT_TRUE(on_track.count("barrier.noname"));
  EXPECT_FALSE(on_track.count("allreduce.excluded"));
  std::vector<std::string> spans;
  for (const nlohmann::json* event : on_track["allreduce.grad"]) {
    if (event->at("ph") == "X") spans.push_back(event->at("name"));
  }
  EXPECT_EQ(spans, (std::vector<std::string>{"NEGOTIATE_ALLREDUCE", "ALLREDUCE"}));
}

TEST(Timeline, AnUnwritablePathIsAUsageError) {
  pipesgd::run_threads(1, [](Worker& w) {
    EXPECT_THROW(w.start_timeline("/proc/no-such-dir/timeline.json"), pipesgd::UsageError);
    w.stop_timeline();
  });
}

}  // namespace
