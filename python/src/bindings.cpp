// pipesgd._C: the public C++ API (include/pipesgd) for Python, the only native part of the package
// pipesgd (python/pipesgd). Thin: every method, collective and check is the C++ library's; this
// file converts arguments and errors. The Horovod-compatible surface is pipesgd/torch/__init__.py.
//
// Errors: UsageError -> ValueError, DataError -> pipesgd.DataError (a ValueError), CommTimeoutError
// -> pipesgd.CommTimeoutError and PeerFailedError -> pipesgd.PeerFailedError (both
// pipesgd.CommError, a RuntimeError); the message is the C++ one-line message.
// The GIL: released for every call that may wait on a peer (collectives, step, finish, shutdown),
// so Python threads run meanwhile; kept for the cheap calls. Threads: one Session per process; its
// worker and optimizers belong to the thread that joined (the C++ contract).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/pipesgd.h"
#include "pipesgd/session.h"

namespace py = pybind11;

namespace {

using Released = py::call_guard<py::gil_scoped_release>;

std::chrono::milliseconds milliseconds(double seconds) {
  if (!(seconds > 0)) throw pipesgd::UsageError(pipesgd::concat("timeout must be > 0 seconds, got ", seconds));
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

// trace, trace_iterations: WorldOptions' ("" = none / every step).
pipesgd::WorldOptions world_options(int servers, double timeout_seconds, const std::string& trace,
                                    const std::string& trace_iterations) {
  pipesgd::WorldOptions options;
  options.servers = servers;
  options.timeout = milliseconds(timeout_seconds);
  options.trace = trace;
  options.trace_iterations = trace_iterations;
  return options;
}

// The optimizer options from a dict of the names of DistributedOptimizerOptions (Python keeps the
// mapping from torch.optim and keyword arguments); an unknown key is a ValueError.
pipesgd::DistributedOptimizerOptions optimizer_options(const py::dict& given) {
  pipesgd::DistributedOptimizerOptions options;
  for (const auto& [key_handle, value] : given) {
    const auto key = key_handle.cast<std::string>();
    if (key == "optimizer") options.optimizer = value.cast<std::string>();
    else if (key == "learning_rate") options.learning_rate = value.cast<float>();
    else if (key == "momentum") options.momentum = value.cast<float>();
    else if (key == "weight_decay") options.weight_decay = value.cast<float>();
    else if (key == "adam_beta1") options.adam_beta1 = value.cast<float>();
    else if (key == "adam_beta2") options.adam_beta2 = value.cast<float>();
    else if (key == "adam_eps") options.adam_eps = value.cast<float>();
    else if (key == "timeout") options.timeout = milliseconds(value.cast<double>());
    else if (key == "flags") options.flags = value.cast<std::map<std::string, std::string>>();
    else if (key == "iterations_per_epoch") options.iterations_per_epoch = value.cast<std::int64_t>();
    else if (key == "total_iterations") options.total_iterations = value.cast<std::int64_t>();
    else if (key == "lr_schedule") options.lr_schedule = value.cast<std::string>();
    else if (key == "lr_warmup_iterations") options.lr_warmup_iterations = value.cast<std::int64_t>();
    else if (key == "backward_passes_per_step") options.backward_passes_per_step = value.cast<int>();
    else if (key == "sum") options.gradient_reduction = value.cast<bool>() ? pipesgd::ReduceOp::kSum : pipesgd::ReduceOp::kAverage;
    else if (key == "forward_hooks") options.forward_hooks = value.cast<bool>();
    else if (key == "broadcast_initial_parameters") options.broadcast_initial_parameters = value.cast<bool>();
    else if (key == "process_set") options.process_set = value.cast<int>();
    else throw pipesgd::UsageError(pipesgd::concat("unknown optimizer option '", key, "'"));
  }
  return options;
}

py::bytes to_bytes(const std::vector<std::byte>& bytes) {
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The optimizer's state from `save` (a member that may wait on peers: run without the GIL) as bytes.
py::bytes state_bytes(pipesgd::DistributedOptimizer& optimizer,
                      pipesgd::OptimizerState (pipesgd::DistributedOptimizer::*save)()) {
  pipesgd::OptimizerState state;
  {
    py::gil_scoped_release released;
    state = (optimizer.*save)();
  }
  return to_bytes(state.bytes);
}

pipesgd::CollectiveKind collective_kind(const std::string& name) {
  using pipesgd::CollectiveKind;
  static const std::map<std::string, CollectiveKind> kinds = {
      {"allreduce", CollectiveKind::kAllreduce},          {"allgather", CollectiveKind::kAllgather},
      {"broadcast", CollectiveKind::kBroadcast},          {"alltoall", CollectiveKind::kAlltoall},
      {"reducescatter", CollectiveKind::kReducescatter},  {"barrier", CollectiveKind::kBarrier},
      {"join", CollectiveKind::kJoin},                    {"add_process_set", CollectiveKind::kAddProcessSet},
      {"remove_process_set", CollectiveKind::kRemoveProcessSet}};
  const auto found = kinds.find(name);
  if (found == kinds.end()) throw pipesgd::UsageError(pipesgd::concat("unknown collective '", name, "'"));
  return found->second;
}

pipesgd::ReduceOp reduce_op(const std::string& name) {
  using pipesgd::ReduceOp;
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct,
                            ReduceOp::kAdasum}) {
    if (name == pipesgd::reduce_op_name(op)) return op;
  }
  throw pipesgd::UsageError(pipesgd::concat("unknown reduction '", name, "'"));
}

// The Collective of Worker.submit's arguments.
pipesgd::Collective make_collective(const std::string& kind, const std::string& name, std::optional<torch::Tensor> input,
                                    std::optional<torch::Tensor> output, const std::string& op, double prescale,
                                    double postscale, int root, std::vector<std::int64_t> splits, int process_set,
                                    std::vector<int> ranks) {
  pipesgd::Collective call;
  call.kind = collective_kind(kind);
  call.name = name;
  if (input) call.input = *input;
  if (output) call.output = *output;
  call.op = reduce_op(op);
  call.prescale = prescale;
  call.postscale = postscale;
  call.root = root;
  call.splits = std::move(splits);
  call.process_set = process_set;
  call.ranks = std::move(ranks);
  return call;
}

pipesgd::OptimizerState to_state(const py::bytes& given) {
  const std::string text = given;
  pipesgd::OptimizerState state;
  state.bytes.resize(text.size());
  std::memcpy(state.bytes.data(), text.data(), text.size());
  return state;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pipesgd's C++ library API (include/pipesgd); use pipesgd.torch";

  py::object value_error = py::reinterpret_borrow<py::object>(PyExc_ValueError);
  py::object runtime_error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  static py::exception<pipesgd::DataError> data_error(m, "DataError", value_error.ptr());
  static py::exception<pipesgd::CommError> comm_error(m, "CommError", runtime_error.ptr());
  static py::exception<pipesgd::CommTimeoutError> timeout_error(m, "CommTimeoutError", comm_error.ptr());
  static py::exception<pipesgd::PeerFailedError> peer_failed_error(m, "PeerFailedError", comm_error.ptr());
  static py::exception<pipesgd::CollectiveMismatchError> mismatch_error(m, "CollectiveMismatchError", runtime_error.ptr());
  py::register_exception_translator([](std::exception_ptr failure) {
    try {
      if (failure) std::rethrow_exception(failure);
    } catch (const pipesgd::UsageError& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const pipesgd::DataError& error) {
      PyErr_SetString(data_error.ptr(), error.what());
    } catch (const pipesgd::CommTimeoutError& error) {
      PyErr_SetString(timeout_error.ptr(), error.what());
    } catch (const pipesgd::PeerFailedError& error) {
      PyErr_SetString(peer_failed_error.ptr(), error.what());
    } catch (const pipesgd::CommError& error) {
      PyErr_SetString(comm_error.ptr(), error.what());
    } catch (const pipesgd::CollectiveMismatchError& error) {
      PyErr_SetString(mismatch_error.ptr(), error.what());
    } catch (const pipesgd::Error& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what());
    }
  });

  py::class_<pipesgd::Worker>(m, "Worker")
      .def_property_readonly("rank", &pipesgd::Worker::rank)
      .def_property_readonly("size", &pipesgd::Worker::size)
      .def_property_readonly("local_rank", &pipesgd::Worker::local_rank)
      .def_property_readonly("servers", &pipesgd::Worker::servers)
      .def_property_readonly("is_mpi", &pipesgd::Worker::is_mpi)
      .def("allgather", &pipesgd::Worker::allgather, py::arg("tensor"), Released())
      .def(
          "submit",
          [](pipesgd::Worker& worker, const std::string& kind, const std::string& name, std::optional<torch::Tensor> input,
             std::optional<torch::Tensor> output, const std::string& op, double prescale, double postscale, int root,
             std::vector<std::int64_t> splits, int process_set, std::vector<int> ranks, bool caller_waits) {
            return worker.submit(make_collective(kind, name, std::move(input), std::move(output), op, prescale,
                                                 postscale, root, std::move(splits), process_set, std::move(ranks)),
                                 caller_waits);
          },
          py::arg("kind"), py::arg("name") = "", py::arg("input") = py::none(), py::arg("output") = py::none(),
          py::arg("op") = "Average", py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("root") = 0,
          py::arg("splits") = std::vector<std::int64_t>{}, py::arg("process_set") = 0,
          py::arg("ranks") = std::vector<int>{}, py::arg("caller_waits") = false, "queues a negotiated collective (include/pipesgd/collectives.h)")
      .def("process_set_ranks", &pipesgd::Worker::process_set_ranks, py::arg("id"))
      .def("new_phase", &pipesgd::Worker::new_phase)
      .def("start_timeline", &pipesgd::Worker::start_timeline, py::arg("path"), py::arg("mark_cycles") = false,
           Released())
      .def("stop_timeline", &pipesgd::Worker::stop_timeline, Released());

  // A submitted collective (c10d's Work): is_completed() never blocks; wait() (without the GIL)
  // returns the results as a list of tensors or raises the collective's error.
  py::class_<pipesgd::Work, std::shared_ptr<pipesgd::Work>>(m, "Work")
      .def("is_completed", &pipesgd::Work::is_completed)
      .def("wait", [](pipesgd::Work& work) {
        std::vector<torch::Tensor> results;
        {
          py::gil_scoped_release released;
          results = work.wait();
        }
        return results;
      })
      .def_property_readonly("name", &pipesgd::Work::name);

  // The session owns its worker (returned with reference_internal: the worker keeps the session alive).
  py::class_<pipesgd::Session>(m, "Session")
      .def_static(
          "join_mpi",
          [](int servers, double timeout_seconds, const std::string& trace, const std::string& trace_iterations) {
            const pipesgd::WorldOptions options = world_options(servers, timeout_seconds, trace, trace_iterations);
            py::gil_scoped_release released;  // a server rank serves inside join_mpi
            return pipesgd::Session::join_mpi(nullptr, nullptr, options);
          },
          py::arg("servers"), py::arg("timeout"), py::arg("trace") = "", py::arg("trace_iterations") = "")
      .def_static(
          "join_alone",
          [](double timeout_seconds, const std::string& trace, const std::string& trace_iterations) {
            return pipesgd::Session::join_alone(world_options(0, timeout_seconds, trace, trace_iterations));
          },
          py::arg("timeout"), py::arg("trace") = "", py::arg("trace_iterations") = "")
      .def_property_readonly("is_worker", &pipesgd::Session::is_worker)
      .def("worker", &pipesgd::Session::worker, py::return_value_policy::reference_internal)
      .def("shutdown", &pipesgd::Session::shutdown, Released())
      .def("fail", &pipesgd::Session::fail, py::arg("reason"), Released());

  py::class_<pipesgd::DistributedOptimizer>(m, "DistributedOptimizer")
      .def(py::init([](pipesgd::Worker& worker, const std::vector<std::pair<std::string, std::vector<torch::Tensor>>>& layers,
                       const std::string& spec, const py::dict& options) {
             std::vector<pipesgd::DistributedOptimizer::Layer> given;
             for (const auto& [name, parameters] : layers) given.push_back({name, parameters});
             const pipesgd::DistributedOptimizerOptions parsed = optimizer_options(options);
             py::gil_scoped_release released;  // broadcasts the initial parameters
             return std::make_unique<pipesgd::DistributedOptimizer>(worker, std::move(given), spec, parsed);
           }),
           py::arg("worker"), py::arg("layers"), py::arg("spec"), py::arg("options"), py::keep_alive<1, 2>())
      .def("step", &pipesgd::DistributedOptimizer::step, Released())
      .def("synchronize_gradients", &pipesgd::DistributedOptimizer::synchronize_gradients, Released())
      .def("apply_plain_sgd", &pipesgd::DistributedOptimizer::apply_plain_sgd, py::arg("lr"), py::arg("weight_decay"))
      .def("save_state",
           [](pipesgd::DistributedOptimizer& optimizer) {
             return state_bytes(optimizer, &pipesgd::DistributedOptimizer::save_state);
           })
      .def(
          "set_apply_callback",
          [](pipesgd::DistributedOptimizer& optimizer, py::function apply) {
            // Called from finish() (GIL released) on the calling thread: take the GIL for Python.
            auto shared = std::make_shared<py::function>(std::move(apply));
            optimizer.set_apply_callback([shared] {
              py::gil_scoped_acquire acquired;
              (*shared)();
            });
          },
          py::arg("apply"))
      .def(
          "step_and_save_state",
          [](pipesgd::DistributedOptimizer& optimizer) {
            return state_bytes(optimizer, &pipesgd::DistributedOptimizer::step_and_save_state);
          })
      .def(
          "load_state", [](pipesgd::DistributedOptimizer& optimizer, const py::bytes& state) { optimizer.load_state(to_state(state)); },
          py::arg("state"))
      .def("zero_grad", &pipesgd::DistributedOptimizer::zero_grad)
      .def("set_learning_rate", &pipesgd::DistributedOptimizer::set_learning_rate, py::arg("lr"))
      .def("before_layer_forward", &pipesgd::DistributedOptimizer::before_layer_forward, py::arg("layer"), Released())
      .def("finish", &pipesgd::DistributedOptimizer::finish, Released())
      .def_property_readonly("iteration", &pipesgd::DistributedOptimizer::iteration)
      .def_property_readonly("method_spec", &pipesgd::DistributedOptimizer::method_spec)
      .def("layer_names", &pipesgd::DistributedOptimizer::layer_names)
      .def("given_layer_names", &pipesgd::DistributedOptimizer::given_layer_names)
      .def("flat_parameters", &pipesgd::DistributedOptimizer::flat_parameters);

  m.def(
      "broadcast_optimizer_state",
      [](pipesgd::Worker& worker, pipesgd::DistributedOptimizer& optimizer, int root) {
        pipesgd::broadcast_optimizer_state(worker, optimizer, root);
      },
      py::arg("worker"), py::arg("optimizer"), py::arg("root"), Released());

  m.def("available_methods", [] {
    py::list methods;
    for (const pipesgd::MethodInfo& info : pipesgd::available_methods()) {
      py::dict method;
      method["name"] = info.name;
      method["summary"] = info.summary;
      method["uses_servers"] = info.uses_servers;
      method["replicas_identical"] = info.replicas_identical;
      method["compute_alone"] = info.compute_alone;
      method["stale_without_compensation"] = info.stale_without_compensation;
      method["needs_forward_hooks"] = info.needs_forward_hooks;
      methods.append(method);
    }
    return methods;
  });
  m.def("default_method", &pipesgd::default_method);
}
