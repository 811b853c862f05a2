// Demangled and short type names, as used for default callback names and user_state errors.
#include "utils/type_name.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace outer::inner {
struct Widget {};
template <class T>
struct Box {};
}  // namespace outer::inner

namespace {
struct Hidden {};
}  // namespace

namespace bridge::utils {
namespace {

TEST(TypeName, Demangles) {
  EXPECT_EQ(demangled_name(typeid(int)), "int");
  EXPECT_EQ(demangled_name(typeid(outer::inner::Widget)), "outer::inner::Widget");
}

TEST(TypeName, ShortNameDropsQualifiersButKeepsTemplateArguments) {
  EXPECT_EQ(short_type_name(typeid(outer::inner::Widget)), "Widget");
  EXPECT_EQ(short_type_name(typeid(Hidden)), "Hidden");  // "(anonymous namespace)::Hidden"
  EXPECT_EQ(short_type_name(typeid(outer::inner::Box<outer::inner::Widget>)), "Box<outer::inner::Widget>");
  EXPECT_EQ(short_type_name(typeid(double)), "double");
}

}  // namespace
}  // namespace bridge::utils
