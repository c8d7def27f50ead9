// Early returns for code inside ferry: internal, not part of the installed headers.
#pragma once

#include <utility>

#include "ferry/status.hpp"

#define FERRY_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::ferry::Status ferry_s_ = (expr);     \
    if (!ferry_s_.ok()) return ferry_s_;   \
  } while (0)

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_CONCAT_(ferry_r_, __LINE__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
