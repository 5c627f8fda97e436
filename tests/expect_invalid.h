// expect_invalid.h — the test suites' one check that a call throws InvalidArgument
// naming the expected argument (SPEC §9: the error names the offending argument).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "mxmoe/error.h"

namespace mxmoe_test {

template <typename F>
void expect_invalid(F&& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected InvalidArgument(" << argument << ")";
  } catch (const mxmoe::InvalidArgument& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument(" << argument << "), got: " << e.what();
  }
}

}  // namespace mxmoe_test
