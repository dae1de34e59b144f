// The registry's method traits (algo/method_descriptor.h, MethodTraits): the facts code outside
// algo/ asks instead of a method's name. Each trait's takers as a closed list, so a trait set on
// another method, or dropped, shows here.
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pipesgd/algo/registry.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The names of the registered methods for which `has` holds, in registry order.
template <typename Trait>
std::vector<std::string> methods_with(Trait has) {
  std::vector<std::string> names;
  for (const MethodDescriptor* method : method_registry()) {
    if (has(method->traits)) names.push_back(method->name);
  }
  return names;
}

using Names = std::vector<std::string>;

TEST(MethodTraitsTest, ComputeAloneIsNocommOnly) {
  EXPECT_EQ(methods_with([](const MethodTraits& t) { return t.compute_alone; }), Names{"nocomm"});
}

TEST(MethodTraitsTest, StaleWithoutCompensationIsPipeOnly) {
  // pipe applies whole gradients K-1 steps stale; sapipe compensates its stale layers (by default),
  // and the parameter-server methods' staleness is the servers'.
  EXPECT_EQ(methods_with([](const MethodTraits& t) { return t.stale_without_compensation; }), Names{"pipe"});
}

TEST(MethodTraitsTest, NeedsForwardHooksIsSapipeOnly) {
  EXPECT_EQ(methods_with([](const MethodTraits& t) { return t.needs_forward_hooks; }), Names{"sapipe"});
}

TEST(MethodTraitsTest, UsesServersIsTheParameterServerFamily) {
  EXPECT_EQ(methods_with([](const MethodTraits& t) { return t.uses_servers; }),
            (Names{"pssync", "asgd", "dcasgd", "odsgd"}));
}

TEST(MethodTraitsTest, ReplicasIdenticalIsEveryAllreduceMethodPssyncAndAuto) {
  EXPECT_EQ(methods_with([](const MethodTraits& t) { return t.replicas_identical; }),
            (Names{"dsync", "pipe", "wfbp", "synceasgd", "mgwfbp", "pssync", "sapipe", "auto"}));
}

TEST(MethodTraitsTest, DefaultMethodIsARegisteredMethod) {
  EXPECT_EQ(default_method_spec(), "dsync");
  EXPECT_NE(method_of_spec(default_method_spec()), nullptr);
}

// --restarts: every method states what its commit holds, and the user guide's table says the same.
TEST(MethodTraitsTest, EveryMethodStatesItsCommitAsTheUserGuideDoes) {
  std::ifstream guide(std::string(PIPESGD_SOURCE_DIR) + "/docs/user-guide.md");
  ASSERT_TRUE(guide) << "docs/user-guide.md";
  const std::string text((std::istreambuf_iterator<char>(guide)), std::istreambuf_iterator<char>());
  for (const MethodDescriptor* method : method_registry()) {
    EXPECT_FALSE(method->commit.empty()) << method->name;
    EXPECT_NE(text.find(concat("| ", method->commit, " |")), std::string::npos)
        << method->name << "'s commit is not in the user guide's table: " << method->commit;
  }
}

}  // namespace
}  // namespace pipesgd
