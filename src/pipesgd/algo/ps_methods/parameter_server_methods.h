#pragma once
// The registry entries of the parameter-server family (algo/registry.cpp lists them): pssync,
// asgd and dcasgd (algo/ps_methods/ps_methods.h); and the options odsgd shares with them
// (algo/odsgd/).
#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/ps_methods/ps_methods.h"

namespace pipesgd {

MethodDescriptor pssync_method();
MethodDescriptor asgd_method();
MethodDescriptor dcasgd_method();

// --servers and --optimizer (sgd only: the servers run SGD) as every parameter-server method
// declares them; the server count given (default 1), in [1, kMaxServers].
inline constexpr int kMaxServers = 1024;
std::vector<OptionDeclaration> parameter_server_declarations();
int parse_servers(const OptionValues& given);

// --dc-lambda, whose default depends on the variant (default_lambda: `constant` and `adaptive` say
// how the method names each variant in --help), and the parse of --dc-lambda and --dc-momentum
// into DelayCompensationOptions for `variant` (chosen by the caller's own option). Throws UsageError.
OptionDeclaration dc_lambda_declaration(const std::string& help, const std::string& constant, const std::string& adaptive);
DelayCompensationOptions parse_delay_compensation(const OptionValues& given, DelayCompensationVariant variant);

}  // namespace pipesgd
