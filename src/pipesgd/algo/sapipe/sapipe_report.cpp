#include "pipesgd/algo/sapipe/sapipe_report.h"

#include <algorithm>
#include <ostream>

#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"

namespace pipesgd {

void SapipeReport::add_json(nlohmann::json& summary, const RunFigures&) const {
  const SapipeFacts& r = facts;
  nlohmann::json json = {{"layers", r.layers},
                         {"stale_layers", r.stale_layers},
                         {"stale_fraction", r.stale_fraction},
                         {"stale_layers_automatic", r.automatic},
                         {"compensation", r.compensation},
                         {"pipeline_start_iteration", r.pipeline_start},
                         {"pipelined", r.pipelined}};
  if (r.dc_term) {
    json["dc_lambda"] = r.lambda;
    json["dc_bound"] = r.dc_bound;
    if (r.dc_bound) json["bounded_compensations"] = r.bounded_compensations;
  }
  if (r.profiled) {
    json["paper_program_stale_layers"] =
        r.paper_stale_layers ? nlohmann::json(*r.paper_stale_layers) : nlohmann::json(nullptr);
    json["predicted_iteration_s"] = r.predicted_iteration;
    json["predicted_stall"] = r.predicted_stall;
    json["forward_s"] = r.profile.forward_seconds;
    json["backward_s"] = r.profile.backward_seconds;
    json["cost_a_s"] = r.cost.a;
    json["cost_b_s_per_byte"] = r.cost.b;
    json["timeline_stale_layers"] = r.timeline_stale_layers;
    nlohmann::json checks = nlohmann::json::array();
    for (const StallCheck& c : r.stall_checks) {
      checks.push_back({{"iteration", c.iteration},
                        {"stale_layers", c.stale_layers},
                        {"stall_fraction", c.stall_fraction},
                        {"cost_scale", c.cost_scale},
                        {"next_stale_layers", c.next_stale_layers}});
    }
    json["stall_checks"] = checks;
  }
  summary["sapipe"] = json;
}

std::string describe_sapipe(const SapipeFacts& r) {
  if (!r.pipelined) {
    const std::string unused =
        r.compensation == "none" ? std::string() : concat(" (compensation ", r.compensation, " never applied)");
    return concat("never pipelined (it would start at iteration ", r.pipeline_start,
                  "): every iteration ran synchronously, the whole gradient in one allreduce after backward, no layer "
                  "stale",
                  unused);
  }
  std::string text = concat("k = ", r.stale_layers, " of ", r.layers, " layers stale, kappa = ",
                            percent(r.stale_fraction), " of the parameters (");
  if (r.automatic) {
    text += "auto: the least k whose simulated pipeline does not stall";
    if (r.predicted_stall) text += "; none hides the communication, so every layer is stale";
    if (r.profiled) {
      text += r.paper_stale_layers ? concat("; the paper's program gives k = ", *r.paper_stale_layers)
                                   : std::string("; the paper's program has no solution");
    }
    if (!r.stall_checks.empty()) {
      text += concat("; the timeline gave k = ", r.timeline_stale_layers, ", then measured:");
      for (const StallCheck& check : r.stall_checks) {
        text += concat(" k = ", check.stale_layers, " waited ", percent(check.stall_fraction),
                       check.next_stale_layers != check.stale_layers
                           ? concat(" -> k = ", check.next_stale_layers, " (cost x",
                                    format_number("%.2f", check.cost_scale), ")")
                           : std::string(" (kept)"),
                       ";");
      }
      text.pop_back();
    }
  } else {
    text += "--stale-layers";
  }
  text += concat("), compensation ", r.compensation);
  if (r.dc_term) {
    text += concat(" (lambda ", r.lambda, ", ",
                   r.dc_bound ? concat("--dc-bound on: the DC scalar clamped to Theorem 3's condition in ",
                                       r.bounded_compensations,
                                       r.compensation == "dc" ? " updates" : " predictions of rank 0")
                              : std::string("DC term unbounded, as printed"),
                   ")");
  }
  return text + concat(", pipelined from iteration ", r.pipeline_start);
}

void SapipeReport::print(std::ostream& out, const RunFigures&) const {
  out << "\nSAPipe partial staleness: " << describe_sapipe(facts) << ".\nSynchronous layers: " << plan << "; " << calls
      << (calls == 1 ? " allreduce" : " allreduces") << " per iteration.\n";
}

ComparisonTable sapipe_table(std::string baseline) {
  ComparisonTable table;
  table.id = "sapipe";
  table.print = [baseline](std::ostream& out, std::span<const RunFigures> runs) {
    auto facts_of = [](const RunFigures& run) -> const SapipeFacts* {
      const auto* report = dynamic_cast<const SapipeReport*>(run.report.get());
      return report ? &report->facts : nullptr;
    };
    if (std::none_of(runs.begin(), runs.end(), [&](const RunFigures& run) { return facts_of(run) != nullptr; })) return;
    const std::string vs = concat("vs ", baseline);
    out << "\nModel performance (the form of the SAPipe paper's Table 2; one run per method):\n";
    std::vector<std::vector<std::string>> rows = {
        {"Method", concat("Test Acc (", runs.front().model, ")"), "Samples/s", vs, "k", "kappa", "Compensation ms"}};
    double baseline_accuracy = -1, baseline_throughput = 0, best_sapipe = -1;
    for (const RunFigures& run : runs) {
      if (run.method_spec == baseline) {
        baseline_accuracy = run.final_test_accuracy;
        baseline_throughput = run.throughput;
      }
      if (facts_of(run)) best_sapipe = std::max(best_sapipe, run.final_test_accuracy);
    }
    for (const RunFigures& run : runs) {
      const SapipeFacts* facts = facts_of(run);
      rows.push_back({run.method_spec,
                      run.final_test_accuracy < 0 ? std::string("-") : format_number("%.4f", run.final_test_accuracy),
                      format_number("%.0f", run.throughput),
                      baseline_throughput > 0 ? format_number("%.3fx", run.throughput / baseline_throughput)
                                              : std::string("-"),
                      facts ? concat(facts->stale_layers, "/", facts->layers) : std::string("-"),
                      facts ? percent(facts->stale_fraction) : std::string("-"),
                      facts ? milliseconds(run.mean.compensation) : std::string("-")});
    }
    if (baseline_accuracy >= 0 && best_sapipe >= 0) {
      rows.push_back({concat("Best SAPipe over ", baseline), format_number("%+.2f pt", (best_sapipe - baseline_accuracy) * 100),
                      "", "", "", "", ""});
    }
    print_table(out, rows);
    for (const RunFigures& run : runs) {
      if (const SapipeFacts* facts = facts_of(run)) out << run.method_spec << ": " << describe_sapipe(*facts) << "\n";
    }
  };
  return table;
}

}  // namespace pipesgd
